#!/usr/bin/env python3
"""check_safetensors.py — a loom checkpoint as others read it.

Runs test_checkpoint with LOOM_CKPT_WRITE=<tmp> (one checkpoint of a tiny model plus
expect.bin, the raw floats of h.0.attn.qkv.weight and of its AdamW slot 1), then checks,
independently of loom's C code:
  * both .safetensors files with a plain reader written from the format spec
    (https://huggingface.co/docs/safetensors: u64 LE header length, JSON header,
    contiguous data section) — Debian ships no python3-safetensors;
  * the manifest: format, version, file sizes and XXH64 checksums (a pure-Python XXH64,
    checked against the published vectors), and its own checksum (the text with its 16
    hex digits written as '0');
  * the tensor values through torch.frombuffer (if torch imports) and through
    safetensors.torch.load_file (if the safetensors module is installed).
Usage: check_safetensors.py <path to test_checkpoint>
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

SIZES = {"F32": 4, "BF16": 2, "F16": 2, "I32": 4, "I64": 8, "U8": 1}


M64 = (1 << 64) - 1
P1, P2, P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
P4, P5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def _round(acc, x):
    return (_rotl((acc + x * P2) & M64, 31) * P1) & M64


def xxh64(data):
    """XXH64, seed 0, from the xxHash spec (doc/xxhash_spec.md)."""
    n, i = len(data), 0
    if n >= 32:
        v = [(P1 + P2) & M64, P2, 0, (-P1) & M64]
        while i + 32 <= n:
            w = struct.unpack_from("<4Q", data, i)
            v = [_round(v[k], w[k]) for k in range(4)]
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & M64
        for k in range(4):
            h = ((h ^ _round(0, v[k])) * P1 + P4) & M64
    else:
        h = P5
    h = (h + n) & M64
    while i + 8 <= n:
        h = (_rotl(h ^ _round(0, struct.unpack_from("<Q", data, i)[0]), 27) * P1 + P4) & M64
        i += 8
    if i + 4 <= n:
        h = (_rotl(h ^ ((struct.unpack_from("<I", data, i)[0] * P1) & M64), 23) * P2 + P3) & M64
        i += 4
    while i < n:
        h = (_rotl(h ^ ((data[i] * P5) & M64), 11) * P1) & M64
        i += 1
    h ^= h >> 33
    h = (h * P2) & M64
    h ^= h >> 29
    h = (h * P3) & M64
    return h ^ (h >> 32)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw), f"{path}: header length {n} past the end"
    assert (8 + n) % 8 == 0, f"{path}: data section not 8-aligned"
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    assert all(isinstance(v, str) for v in meta.values()), "metadata values must be strings"
    data = raw[8 + n:]
    tensors, spans = {}, []
    for name, info in header.items():
        assert set(info) == {"dtype", "shape", "data_offsets"}, (name, info)
        begin, end = info["data_offsets"]
        numel = 1
        for d in info["shape"]:
            numel *= d
        assert numel * SIZES[info["dtype"]] == end - begin, (name, info)
        tensors[name] = (info["dtype"], info["shape"], data[begin:end])
        spans.append((begin, end))
    spans.sort()
    at = 0
    for begin, end in spans:
        assert begin == at, f"{path}: gap or overlap at {begin}"
        at = end
    assert at == len(data), f"{path}: {len(data) - at} trailing bytes"
    return tensors, meta, raw


def main():
    exe = sys.argv[1]
    for data, want in [(b"", 0xEF46DB3751D8E999), (b"abc", 0x44BC2CF5AD770999),
                       (b"hello", 0x26C7827D889F6DA3)]:
        assert xxh64(data) == want, data
    try:  # the reference implementation, where installed
        import xxhash
        blob = bytes(range(256)) * 3
        assert all(xxh64(blob[:n]) == xxhash.xxh64_intdigest(blob[:n]) for n in range(0, 768, 7))
        print("pure-Python XXH64 agrees with the xxhash module")
    except ImportError:
        pass
    with tempfile.TemporaryDirectory(prefix="loom-st-py-") as tmp:
        run = subprocess.run([exe], env=dict(os.environ, LOOM_CKPT_WRITE=tmp),
                             capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"{exe} failed:\n{run.stdout}{run.stderr}")
        ckpt = os.path.join(tmp, "step_00000002")
        with open(os.path.join(ckpt, "manifest.json"), "rb") as f:
            text = f.read()
        manifest = json.loads(text)
        assert manifest["format"] == "loom-checkpoint" and manifest["version"] == 1
        assert manifest["step"] == 2 and manifest["steps_taken"] == 2
        assert manifest["config"] == {"recipe": "check_safetensors"}
        recorded = manifest["checksum"]
        assert recorded.startswith("xxh64:")
        at = text.rfind(recorded.encode()) + 6  # the checksum member is the last one
        zeroed = text[:at] + b"0" * 16 + text[at + 16:]
        assert f"{xxh64(zeroed):016x}" == recorded[6:], "manifest self-checksum"
        for name, rec in manifest["files"].items():
            with open(os.path.join(ckpt, name), "rb") as f:
                raw = f.read()
            assert len(raw) == rec["bytes"], name
            assert f"{xxh64(raw):016x}" == rec["xxh64"], name

        model, mmeta, _ = read_safetensors(os.path.join(ckpt, "model.safetensors"))
        optim, ometa, _ = read_safetensors(os.path.join(ckpt, "optim.safetensors"))
        name = "h.0.attn.qkv.weight"
        m = manifest["model"]
        assert model[name][0] == "F32" and model[name][1] == [3, m["dim"], m["dim"]]
        assert json.loads(mmeta[name]) == {"shape": [3, m["dim"], m["dim"]], "slice_start": [0, 0, 0]}
        assert model["wte"][1] == [m["vocab_padded"], m["dim"]]
        assert len(optim) == manifest["optimizer"]["slots"] * len(model)
        assert ometa["loom.optimizer"] == "adamw" and json.loads(ometa[name + ".state1"])["shape"]
        with open(os.path.join(tmp, "expect.bin"), "rb") as f:
            expect = f.read()
        half = len(expect) // 2
        assert model[name][2] == expect[:half], "weights differ from the session's"
        assert optim[name + ".state1"][2] == expect[half:], "optimizer slot 1 differs"
        print(f"plain reader: {len(model)} model and {len(optim)} optimizer tensors, layout, "
              "metadata and checksums agree")

        try:
            import torch
        except ImportError:
            print("torch not importable: value check through torch skipped")
            return 0
        ref = torch.frombuffer(bytearray(expect[:half]), dtype=torch.float32).reshape(model[name][1])
        got = torch.frombuffer(bytearray(model[name][2]), dtype=torch.float32).reshape(model[name][1])
        assert torch.equal(ref, got)
        print(f"torch {torch.__version__}: {name} {list(got.shape)} equal")
        try:
            from safetensors.torch import load_file
        except ImportError:
            print("safetensors module not installed: load_file check skipped (plain reader used)")
            return 0
        loaded = load_file(os.path.join(ckpt, "model.safetensors"))
        assert torch.equal(loaded[name], ref)
        assert set(loaded) == set(model)
        print(f"safetensors.torch.load_file: {len(loaded)} tensors, {name} equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
