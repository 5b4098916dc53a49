"""Shared fixtures for the dsqwen package tests (run by scripts/test_packages.sh
against the installed package: `pip install .` then `pytest tests/python`)."""
import array
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
TINY = os.path.join(DATA, "tiny")
TOKENIZER_JSON = os.path.join(DATA, "model", "tokenizer.json")

# test_ctypes.py is a script run by ctest with its own arguments, not a pytest module
collect_ignore = ["test_ctypes.py"]


def read_f32(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    return a


@pytest.fixture(scope="session")
def golden():
    with open(os.path.join(TINY, "golden.json")) as f:
        g = json.load(f)
    g["prefill"] = read_f32(os.path.join(TINY, g["prefill_logits"]))
    g["decode"] = read_f32(os.path.join(TINY, g["decode_logits"]))
    return g


@pytest.fixture(scope="session")
def dsqwen():
    import dsqwen as mod
    return mod


@pytest.fixture
def model(dsqwen):
    with dsqwen.Model(TINY, backend="cpu") as m:
        yield m


@pytest.fixture(scope="session")
def tokenizer(dsqwen):
    with dsqwen.Tokenizer.load(TOKENIZER_JSON) as t:
        yield t
