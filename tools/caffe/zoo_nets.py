"""Prototxt text of well-known Caffe nets (AlexNet, GoogLeNet, SqueezeNet 1.1, ResNet-50/101/152, MobileNet v1/v2, VGG16,
DenseNet-121), written in the layer style of their published Caffe files, for benchmarks and tests that may not download."""

from __future__ import annotations

from collections.abc import Callable


class Builder:
    """Appends layer blocks; each method returns the name of its top."""

    def __init__(self, name: str, shape: tuple[int, ...]) -> None:
        dims = " ".join(f"dim: {d}" for d in shape)
        self.lines = [f'name: "{name}"', f'layer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ {dims} }} }} }}']

    def add(self, name: str, typ: str, bottoms: list[str] | str, top: str | None = None, body: str = "") -> str:
        bs = [bottoms] if isinstance(bottoms, str) else bottoms
        top = top or name
        bottom = " ".join(f'bottom: "{b}"' for b in bs)
        self.lines.append(f'layer {{ name: "{name}" type: "{typ}" {bottom} top: "{top}" {body} }}')
        return top

    def conv(self, name: str, x: str, n: int, k: int, s: int = 1, p: int = 0, *, group: int = 1, bias: bool = True,
             kh: int = 0, kw: int = 0, ph: int = -1, pw: int = -1) -> str:
        shape = f"kernel_h: {kh} kernel_w: {kw} pad_h: {ph} pad_w: {pw}" if kh else f"kernel_size: {k} pad: {p}"
        extra = (f" group: {group}" if group > 1 else "") + ("" if bias else " bias_term: false")
        return self.add(name, "Convolution", x, body=f'convolution_param {{ num_output: {n} {shape} stride: {s}{extra} '
                        f'weight_filler {{ type: "msra" }} }}')

    def relu(self, name: str, x: str) -> str:
        return self.add(name, "ReLU", x, x)

    def bn_scale(self, name: str, x: str) -> str:
        self.add(f"{name}_bn" if not name.startswith("bn") else name, "BatchNorm", x, x, "batch_norm_param { use_global_stats: true }")
        return self.add(f"scale{name[2:]}" if name.startswith("bn") else f"{name}_scale", "Scale", x, x, "scale_param { bias_term: true }")

    def pool(self, name: str, x: str, method: str, k: int = 0, s: int = 1, p: int = 0, *, global_: bool = False) -> str:
        geom = "global_pooling: true" if global_ else f"kernel_size: {k} stride: {s}" + (f" pad: {p}" if p else "")
        return self.add(name, "Pooling", x, body=f"pooling_param {{ pool: {method} {geom} }}")

    def fc(self, name: str, x: str, n: int) -> str:
        return self.add(name, "InnerProduct", x, body=f'inner_product_param {{ num_output: {n} weight_filler {{ type: "xavier" }} }}')

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def alexnet(batch: int = 1) -> str:
    """BVLC AlexNet (bvlc_alexnet/deploy.prototxt): grouped conv2/4/5, LRN after conv1 and conv2."""
    b = Builder("AlexNet", (batch, 3, 227, 227))
    x = b.relu("relu1", b.conv("conv1", "data", 96, 11, 4))
    x = b.pool("pool1", b.add("norm1", "LRN", x, body="lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 }"), "MAX", 3, 2)
    x = b.relu("relu2", b.conv("conv2", x, 256, 5, 1, 2, group=2))
    x = b.pool("pool2", b.add("norm2", "LRN", x, body="lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 }"), "MAX", 3, 2)
    x = b.relu("relu3", b.conv("conv3", x, 384, 3, 1, 1))
    x = b.relu("relu4", b.conv("conv4", x, 384, 3, 1, 1, group=2))
    x = b.pool("pool5", b.relu("relu5", b.conv("conv5", x, 256, 3, 1, 1, group=2)), "MAX", 3, 2)
    x = b.add("drop6", "Dropout", b.relu("relu6", b.fc("fc6", x, 4096)), "fc6", "dropout_param { dropout_ratio: 0.5 }")
    x = b.add("drop7", "Dropout", b.relu("relu7", b.fc("fc7", x, 4096)), "fc7", "dropout_param { dropout_ratio: 0.5 }")
    b.add("prob", "Softmax", b.fc("fc8", x, 1000))
    return b.text()


def googlenet(batch: int = 1) -> str:
    """BVLC GoogLeNet (bvlc_googlenet/deploy.prototxt): nine inception modules, LRN, dropout 0.4."""
    b = Builder("GoogleNet", (batch, 3, 224, 224))
    x = b.relu("conv1/relu_7x7", b.conv("conv1/7x7_s2", "data", 64, 7, 2, 3))
    x = b.add("pool1/norm1", "LRN", b.pool("pool1/3x3_s2", x, "MAX", 3, 2), body="lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 }")
    x = b.relu("conv2/relu_3x3_reduce", b.conv("conv2/3x3_reduce", x, 64, 1))
    x = b.relu("conv2/relu_3x3", b.conv("conv2/3x3", x, 192, 3, 1, 1))
    x = b.pool("pool2/3x3_s2", b.add("conv2/norm2", "LRN", x, body="lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 }"), "MAX", 3, 2)

    def inception(n: str, x: str, c1: int, r3: int, c3: int, r5: int, c5: int, pp: int) -> str:
        a = b.relu(f"{n}/relu_1x1", b.conv(f"{n}/1x1", x, c1, 1))
        t = b.relu(f"{n}/relu_3x3_reduce", b.conv(f"{n}/3x3_reduce", x, r3, 1))
        t = b.relu(f"{n}/relu_3x3", b.conv(f"{n}/3x3", t, c3, 3, 1, 1))
        f = b.relu(f"{n}/relu_5x5_reduce", b.conv(f"{n}/5x5_reduce", x, r5, 1))
        f = b.relu(f"{n}/relu_5x5", b.conv(f"{n}/5x5", f, c5, 5, 1, 2))
        q = b.relu(f"{n}/relu_pool_proj", b.conv(f"{n}/pool_proj", b.pool(f"{n}/pool", x, "MAX", 3, 1, 1), pp, 1))
        return b.add(f"{n}/output", "Concat", [a, t, f, q])

    x = inception("inception_3a", x, 64, 96, 128, 16, 32, 32)
    x = inception("inception_3b", x, 128, 128, 192, 32, 96, 64)
    x = b.pool("pool3/3x3_s2", x, "MAX", 3, 2)
    for n, cfg in (("4a", (192, 96, 208, 16, 48, 64)), ("4b", (160, 112, 224, 24, 64, 64)), ("4c", (128, 128, 256, 24, 64, 64)),
                   ("4d", (112, 144, 288, 32, 64, 64)), ("4e", (256, 160, 320, 32, 128, 128))):
        x = inception(f"inception_{n}", x, *cfg)
    x = b.pool("pool4/3x3_s2", x, "MAX", 3, 2)
    x = inception("inception_5a", x, 256, 160, 320, 32, 128, 128)
    x = inception("inception_5b", x, 384, 192, 384, 48, 128, 128)
    x = b.add("pool5/drop_7x7_s1", "Dropout", b.pool("pool5/7x7_s1", x, "AVE", 7, 1), None, "dropout_param { dropout_ratio: 0.4 }")
    b.add("prob", "Softmax", b.fc("loss3/classifier", x, 1000))
    return b.text()


def squeezenet11(batch: int = 1) -> str:
    """SqueezeNet v1.1 (DeepScale): fire modules (squeeze 1x1, expand 1x1 and 3x3), global average pooling."""
    b = Builder("SqueezeNet_v1.1", (batch, 3, 227, 227))
    x = b.pool("pool1", b.relu("relu_conv1", b.conv("conv1", "data", 64, 3, 2)), "MAX", 3, 2)

    def fire(n: str, x: str, s: int, e: int) -> str:
        q = b.relu(f"{n}/relu_squeeze1x1", b.conv(f"{n}/squeeze1x1", x, s, 1))
        e1 = b.relu(f"{n}/relu_expand1x1", b.conv(f"{n}/expand1x1", q, e, 1))
        e3 = b.relu(f"{n}/relu_expand3x3", b.conv(f"{n}/expand3x3", q, e, 3, 1, 1))
        return b.add(f"{n}/concat", "Concat", [e1, e3])

    x = fire("fire3", fire("fire2", x, 16, 64), 16, 64)
    x = b.pool("pool3", x, "MAX", 3, 2)
    x = fire("fire5", fire("fire4", x, 32, 128), 32, 128)
    x = b.pool("pool5", x, "MAX", 3, 2)
    for i, (s, e) in zip(range(6, 10), ((48, 192), (48, 192), (64, 256), (64, 256)), strict=True):
        x = fire(f"fire{i}", x, s, e)
    x = b.add("drop9", "Dropout", x, x, "dropout_param { dropout_ratio: 0.5 }")
    x = b.relu("relu_conv10", b.conv("conv10", x, 1000, 1))
    b.add("prob", "Softmax", b.pool("pool10", x, "AVE", global_=True))
    return b.text()


def resnet(depth: int = 50, batch: int = 1) -> str:
    """ResNet-50/101/152 (KaimingHe/deep-residual-networks): bottlenecks of conv (no bias) + BatchNorm + Scale."""
    blocks = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}[depth]
    b = Builder(f"ResNet-{depth}", (batch, 3, 224, 224))
    x = b.conv("conv1", "data", 64, 7, 2, 3)
    b.add("bn_conv1", "BatchNorm", x, x, "batch_norm_param { use_global_stats: true }")
    b.add("scale_conv1", "Scale", x, x, "scale_param { bias_term: true }")
    x = b.pool("pool1", b.relu("conv1_relu", x), "MAX", 3, 2)

    def cbs(name: str, x: str, n: int, k: int, s: int, p: int) -> str:
        y = b.conv(f"res{name}", x, n, k, s, p, bias=False)
        b.add(f"bn{name}", "BatchNorm", y, y, "batch_norm_param { use_global_stats: true }")
        return b.add(f"scale{name}", "Scale", y, y, "scale_param { bias_term: true }")

    for stage, (count, width) in enumerate(zip(blocks, (64, 128, 256, 512), strict=True), 2):
        for i in range(count):
            tag = f"{stage}{chr(ord('a') + i)}" if count <= 6 else (f"{stage}a" if i == 0 else f"{stage}b{i}")
            stride = 2 if (i == 0 and stage > 2) else 1
            short = cbs(f"{tag}_branch1", x, width * 4, 1, stride, 0) if i == 0 else x
            y = b.relu(f"res{tag}_branch2a_relu", cbs(f"{tag}_branch2a", x, width, 1, stride, 0))
            y = b.relu(f"res{tag}_branch2b_relu", cbs(f"{tag}_branch2b", y, width, 3, 1, 1))
            y = cbs(f"{tag}_branch2c", y, width * 4, 1, 1, 0)
            x = b.relu(f"res{tag}_relu", b.add(f"res{tag}", "Eltwise", [short, y]))
    b.add("prob", "Softmax", b.fc("fc1000", b.pool("pool5", x, "AVE", 7, 1), 1000))
    return b.text()


def mobilenet_v1(batch: int = 1) -> str:
    """MobileNet v1 (shicai/MobileNet-Caffe): depthwise (group = channels) and pointwise convs, each with BatchNorm + Scale."""
    b = Builder("MOBILENET", (batch, 3, 224, 224))

    def cbr(name: str, x: str, n: int, k: int, s: int, group: int = 1) -> str:
        y = b.conv(name, x, n, k, s, k // 2, group=group, bias=False)
        b.add(f"{name}/bn", "BatchNorm", y, y, "batch_norm_param { use_global_stats: true }")
        b.add(f"{name}/scale", "Scale", y, y, "scale_param { bias_term: true }")
        return b.relu(f"relu{name[4:]}", y)

    x = cbr("conv1", "data", 32, 3, 2)
    cfg = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [(1024, 2), (1024, 1)]
    c = 32
    for i, (n, s) in enumerate(cfg):
        tag = f"{i // 2 + 2}_{i % 2 + 1}" if i < 12 else ("6" if i == 12 else "7")
        tag = ["2_1", "2_2", "3_1", "3_2", "4_1", "4_2", "5_1", "5_2", "5_3", "5_4", "5_5", "5_6", "6"][i]
        x = cbr(f"conv{tag}/dw", x, c, 3, s, group=c)
        x = cbr(f"conv{tag}/sep", x, n, 1, 1)
        c = n
    x = b.pool("pool6", x, "AVE", global_=True)
    x = b.conv("fc7", x, 1000, 1)
    b.add("prob", "Softmax", x)
    return b.text()


def mobilenet_v2(batch: int = 1) -> str:
    """MobileNet v2 (shicai/MobileNet-Caffe): inverted residuals (expand, depthwise, linear project) with Eltwise shortcuts."""
    b = Builder("MOBILENET_V2", (batch, 3, 224, 224))

    def cb(name: str, x: str, n: int, k: int, s: int, group: int = 1, relu: bool = True) -> str:
        y = b.conv(name, x, n, k, s, k // 2, group=group, bias=False)
        b.add(f"{name}/bn", "BatchNorm", y, y, "batch_norm_param { use_global_stats: true }")
        b.add(f"{name}/scale", "Scale", y, y, "scale_param { bias_term: true }")
        return b.relu(f"{name}/relu", y) if relu else y

    x, c = cb("conv1", "data", 32, 3, 2), 32
    idx = 2
    for t, n, reps, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for r in range(reps):
            stride = s if r == 0 else 1
            name = f"conv{idx}_{r + 1}"
            y = cb(f"{name}/expand", x, c * t, 1, 1) if t != 1 else x
            y = cb(f"{name}/dwise", y, c * t, 3, stride, group=c * t)
            y = cb(f"{name}/linear", y, n, 1, 1, relu=False)
            x = b.add(f"block_{idx}_{r + 1}", "Eltwise", [x, y]) if (stride == 1 and c == n) else y
            c = n
        idx += 1
    x = cb("conv6_4", x, 1280, 1, 1)
    x = b.conv("fc7", b.pool("pool6", x, "AVE", global_=True), 1000, 1)
    b.add("prob", "Softmax", x)
    return b.text()


def vgg16(batch: int = 1) -> str:
    """VGG16 (VGG_ILSVRC_16_layers): 13 3x3 convolutions in five blocks, three fully connected layers."""
    b = Builder("VGG_ILSVRC_16_layers", (batch, 3, 224, 224))
    x = "data"
    for blk, (n, reps) in enumerate(((64, 2), (128, 2), (256, 3), (512, 3), (512, 3)), 1):
        for r in range(1, reps + 1):
            x = b.relu(f"relu{blk}_{r}", b.conv(f"conv{blk}_{r}", x, n, 3, 1, 1))
        x = b.pool(f"pool{blk}", x, "MAX", 2, 2)
    x = b.add("drop6", "Dropout", b.relu("relu6", b.fc("fc6", x, 4096)), "fc6")
    x = b.add("drop7", "Dropout", b.relu("relu7", b.fc("fc7", x, 4096)), "fc7")
    b.add("prob", "Softmax", b.fc("fc8", x, 1000))
    return b.text()


def densenet121(batch: int = 1) -> str:
    """DenseNet-121 (shicai/DenseNet-Caffe): BN-Scale-ReLU-conv dense layers, concatenation, transitions; pooling ceil_mode."""
    b = Builder("DENSENET_121", (batch, 3, 224, 224))

    def bsr(name: str, x: str) -> str:
        y = b.add(f"{name}/bn", "BatchNorm", x, f"{name}/bn", "batch_norm_param { eps: 1e-5 use_global_stats: true }")
        b.add(f"{name}/scale", "Scale", y, y, "scale_param { bias_term: true }")
        return b.relu(f"relu{name}", y)

    x = b.conv("conv1", "data", 64, 7, 2, 3, bias=False)
    x = b.relu("relu1", b.add("conv1/scale", "Scale", b.add("conv1/bn", "BatchNorm", x, x, "batch_norm_param { use_global_stats: true }"),
                             x, "scale_param { bias_term: true }"))
    x = b.add("pool1", "Pooling", x, body="pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 ceil_mode: false }")
    c = 64
    for stage, layers in enumerate((6, 12, 24, 16), 2):
        for i in range(1, layers + 1):
            n = f"conv{stage}_{i}"
            y = b.conv(f"{n}/x1", bsr(f"{n}/x1", x), 128, 1, bias=False)
            y = b.conv(f"{n}/x2", bsr(f"{n}/x2", y), 32, 3, 1, 1, bias=False)
            x = b.add(f"concat_{stage}_{i}", "Concat", [x, y])
            c += 32
        if stage < 5:
            c //= 2
            y = b.conv(f"conv{stage}_blk", bsr(f"conv{stage}_blk", x), c, 1, bias=False)
            x = b.add(f"pool{stage}", "Pooling", y, body="pooling_param { pool: AVE kernel_size: 2 stride: 2 }")
    x = b.pool("pool5", bsr("conv5_blk", x), "AVE", global_=True)
    b.add("prob", "Softmax", b.conv("fc6", x, 1000, 1))
    return b.text()


NETS: dict[str, Callable[[int], str]] = {
    "alexnet": alexnet, "googlenet": googlenet, "squeezenet1.1": squeezenet11, "resnet50": lambda n: resnet(50, n),
    "resnet101": lambda n: resnet(101, n), "resnet152": lambda n: resnet(152, n), "mobilenet_v1": mobilenet_v1,
    "mobilenet_v2": mobilenet_v2, "vgg16": vgg16, "densenet121": densenet121,
}


def train_val(deploy: str, classes: int = 1000) -> str:
    """A trainable variant of a generated deploy net: labels beside the input, the softmax replaced by SoftmaxWithLoss."""
    head, _, rest = deploy.partition('top: "data" input_param { shape { ')
    dims = rest.split(" } }", 1)[0]
    batch = int(dims.split()[1])
    lines = [ln for ln in (head + 'top: "data" top: "label" input_param { shape { ' + dims + f" }} shape {{ dim: {batch} }} }}"
             + rest.split(" } }", 1)[1]).splitlines() if 'type: "Softmax"' not in ln]
    last = [ln for ln in deploy.splitlines() if 'type: "Softmax"' in ln][0]
    logits = last.split('bottom: "')[1].split('"')[0]
    lines.append(f'layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "{logits}" bottom: "label" top: "loss" }}')
    return "\n".join(lines).replace("use_global_stats: true", "use_global_stats: false") + "\n"
