"""Write scikit-learn's bundled 8x8 digits as train/test .npz files for `ddl-caffe convert`.

    python examples/caffe/make_digits.py examples/caffe/data
"""

import sys
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

out = Path(sys.argv[1] if len(sys.argv) > 1 else "examples/caffe/data")
out.mkdir(parents=True, exist_ok=True)
digits = load_digits()
x = digits.images.astype(np.uint8)          # values 0..16; the net scales them by 1/16
y = digits.target.astype(np.int64)
order = np.random.default_rng(0).permutation(len(y))
train, test = order[:1500], order[1500:]    # 1500 to train, 297 to test
np.savez(out / "digits_train.npz", x=x[train], y=y[train])
np.savez(out / "digits_test.npz", x=x[test], y=y[test])
print(f"wrote {out}/digits_train.npz ({len(train)}) and {out}/digits_test.npz ({len(test)})")
