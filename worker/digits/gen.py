#!/usr/bin/python3
"""Regenerates digits.txt.gz from scikit-learn's bundled digits dataset.

Run once with Debian's python3-sklearn: /usr/bin/python3 gen.py
"""
import gzip

import sklearn
from sklearn.datasets import load_digits

d = load_digits()
alpha = "0123456789abcdefg"
lines = [
    "# Optical Recognition of Handwritten Digits, 8x8 (E. Alpaydin, C. Kaynak, UCI Machine Learning Repository),",
    "# as bundled with scikit-learn %s (sklearn.datasets.load_digits), which distributes it under its" % sklearn.__version__,
    "# BSD-3-Clause license. Regenerate with worker/digits/gen.py.",
    "# One image per line: its label, a space, then 64 pixels row by row, each 0..16 as one character of 0-9a-g.",
]
for x, y in zip(d.data, d.target):
    lines.append("%d %s" % (y, "".join(alpha[int(v)] for v in x)))
with gzip.GzipFile("digits.txt.gz", "wb", mtime=0) as f:
    f.write(("\n".join(lines) + "\n").encode())
