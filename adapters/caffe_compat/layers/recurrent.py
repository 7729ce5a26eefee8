"""Recurrent layers: LSTMUnit, and RNN and LSTM as Caffe unrolls them (blob order, cont flags, carried state)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ddl.caffe.layers.base import Layer


def lstm_unit(c_prev: torch.Tensor, gates: torch.Tensor, cont: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One LSTM step on gate pre-activations (i, f, o, g along the last axis): c = cont f c_prev + i g, h = o tanh(c)."""
    i, f, o, g = gates.chunk(4, -1)
    c = cont * torch.sigmoid(f) * c_prev + torch.sigmoid(i) * torch.tanh(g)
    return c, torch.sigmoid(o) * torch.tanh(c)


class LSTMUnit(Layer):
    """Bottoms c_{t-1} (1, N, H), gate inputs (1, N, 4H), cont (1, N); tops c_t, h_t."""

    type = "LSTMUnit"
    min_bottoms, max_bottoms = 3, 3
    min_tops, max_tops = 2, 2

    def allow_force_backward(self, i: int) -> bool:
        return i != 2                  # Caffe cannot backpropagate to the sequence indicators

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        c, x, cont = shapes
        if len(c) != 3 or c[0] != 1 or x != (1, c[1], 4 * c[2]) or tuple(cont) != (1, c[1]):
            raise self.error(f"needs c (1, N, H), gates (1, N, 4H) and cont (1, N); got {list(c)}, {list(x)}, {list(cont)}")

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        c_prev, gates, cont = bottoms
        c, h = lstm_unit(c_prev, gates, cont.detach()[..., None].to(c_prev.dtype))
        return [c, h]


class _Recurrent(Layer):
    """Shared by RNN and LSTM: bottoms x (T, N, ...), cont (T, N), [x_static (N, ...)], [initial states]."""

    params = ("recurrent_param",)
    states = 1                    # hidden blobs carried between passes (h; LSTM: h and c)
    min_bottoms, max_bottoms = 2, 5

    def allow_force_backward(self, i: int) -> bool:
        return i != 1

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        p = self.lp.recurrent_param
        self.hidden = int(p.num_output)
        if self.hidden <= 0:
            raise self.error("recurrent_param.num_output must be given and positive")
        self.expose = p.expose_hidden
        extra = len(shapes) - 2 - (self.states if self.expose else 0)
        if extra not in (0, 1):
            want = f"x, cont{', [x_static]'}" + (", " + ", ".join(self.state_names()) if self.expose else "")
            raise self.error(f"takes bottoms {want}; got {len(shapes)}")
        self.static = extra == 1
        x, cont = shapes[0], shapes[1]
        if len(x) < 2 or tuple(cont) != tuple(x[:2]):
            raise self.error(f"x must be (T, N, ...) and cont (T, N); got {list(x)} and {list(cont)}")
        want_tops = 1 + (self.states if self.expose else 0)
        if len(self.top) != want_tops:
            raise self.error(f"needs {want_tops} tops, got {len(self.top)}")
        n = x[1]
        if self.static and shapes[2][0] != n:
            raise self.error(f"x_static must be (N={n}, ...), got {list(shapes[2])}")
        if self.expose:
            for s in shapes[2 + extra:]:
                if tuple(s) != (1, n, self.hidden):
                    raise self.error(f"initial states must be (1, {n}, {self.hidden}), got {list(s)}")
        self.make_params(math.prod(x[2:]), math.prod(shapes[2][1:]) if self.static else 0)
        self.carried: list[torch.Tensor] | None = None

    def state_names(self) -> list[str]:
        return ["h_0"]

    def make_params(self, input_dim: int, static_dim: int) -> None:
        raise NotImplementedError

    def initial(self, bottoms: list[torch.Tensor], n: int) -> list[torch.Tensor]:
        x = bottoms[0]
        if self.expose:
            return [b[0] for b in bottoms[len(bottoms) - self.states:]]
        # Caffe carries the last pass's final state into the next pass (cont = 0 resets it).
        if self.carried is not None and self.carried[0].shape[0] == n:
            return [s.to(x.dtype) for s in self.carried]
        return [x.new_zeros(n, self.hidden) for _ in range(self.states)]

    def remember(self, finals: list[torch.Tensor]) -> None:
        if not self.expose and self.update_stats:
            self.carried = [f.detach() for f in finals]


class LSTM(_Recurrent):
    """Blobs W_xc (4H, D), b_c (4H), [W_xc_static (4H, S)], W_hc (4H, H); gates i, f, o, g; tops h [, h_T, c_T]."""

    type = "LSTM"
    states = 2
    max_tops = 3

    def state_names(self) -> list[str]:
        return ["h_0", "c_0"]

    def make_params(self, input_dim: int, static_dim: int) -> None:
        p, g = self.lp.recurrent_param, 4 * self.hidden
        self.blobs = [self.make_blob((g, input_dim), p.weight_filler, what="W_xc"),
                      self.make_blob((g,), p.bias_filler, what="b_c")]
        if static_dim:
            self.blobs.append(self.make_blob((g, static_dim), p.weight_filler, what="W_xc_static"))
        self.blobs.append(self.make_blob((g, self.hidden), p.weight_filler, what="W_hc"))

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x, cont = bottoms[0], bottoms[1].detach().to(bottoms[0].dtype)
        t_len, n = x.shape[0], x.shape[1]
        w_hc = self.blobs[-1]
        gates_x = F.linear(x.reshape(t_len, n, -1), self.blobs[0], self.blobs[1])
        if self.static:
            gates_x = gates_x + F.linear(bottoms[2].reshape(n, -1), self.blobs[2])[None]
        h, c = self.initial(bottoms, n)
        hs = []
        for t in range(t_len):
            ct = cont[t][:, None]
            c, h = lstm_unit(c, gates_x[t] + F.linear(ct * h, w_hc), ct)
            hs.append(h)
        self.remember([h, c])
        out = torch.stack(hs)
        return [out, h[None], c[None]] if self.expose else [out]


class RNN(_Recurrent):
    """Blobs W_xh (H, D), b_h (H), [W_xh_static (H, S)], W_hh (H, H), W_ho (O, H), b_o (O); tops o [, h_T]."""

    type = "RNN"
    max_tops = 2

    def make_params(self, input_dim: int, static_dim: int) -> None:
        p, hd = self.lp.recurrent_param, self.hidden
        self.blobs = [self.make_blob((hd, input_dim), p.weight_filler, what="W_xh"),
                      self.make_blob((hd,), p.bias_filler, what="b_h")]
        if static_dim:
            self.blobs.append(self.make_blob((hd, static_dim), p.weight_filler, what="W_xh_static"))
        self.blobs += [self.make_blob((hd, hd), p.weight_filler, what="W_hh"),
                       self.make_blob((hd, hd), p.weight_filler, what="W_ho"),
                       self.make_blob((hd,), p.bias_filler, what="b_o")]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        x, cont = bottoms[0], bottoms[1].detach().to(bottoms[0].dtype)
        t_len, n = x.shape[0], x.shape[1]
        w_hh, w_ho, b_o = self.blobs[-3:]
        pre_x = F.linear(x.reshape(t_len, n, -1), self.blobs[0], self.blobs[1])
        if self.static:
            pre_x = pre_x + F.linear(bottoms[2].reshape(n, -1), self.blobs[2])[None]
        (h,) = self.initial(bottoms, n)
        os = []
        for t in range(t_len):
            h = torch.tanh(F.linear(cont[t][:, None] * h, w_hh) + pre_x[t])
            os.append(torch.tanh(F.linear(h, w_ho, b_o)))
        self.remember([h])
        out = torch.stack(os)
        return [out, h[None]] if self.expose else [out]
