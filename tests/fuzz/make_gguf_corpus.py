#!/usr/bin/env python3
"""Writes the seed corpus for fuzz_gguf: a few tiny, valid GGUF files that together use every
metadata value type, nested and string arrays, v2 and v3 headers, a non-default alignment and
each tensor type the engine dequantizes. Standard library only, so it does not share code (or
bugs) with engine/gguf/reader.cpp. The files have no .gguf suffix because *.gguf is git-ignored. Usage: python3 tests/fuzz/make_gguf_corpus.py tests/fuzz/corpus_gguf
"""
import os
import struct
import sys

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
              BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}
# ggml type id -> (block elements, block bytes)
GGML = {"f32": (0, 1, 4), "f16": (1, 1, 2), "q4_0": (2, 32, 18), "q8_0": (8, 32, 34),
        "q4_k": (12, 256, 144), "q5_k": (13, 256, 176), "q6_k": (14, 256, 210),
        "bf16": (30, 1, 2)}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def payload(t, v):
    """Encodes value v of GGUF type t (arrays: v = (element type, [elements]))."""
    if t == STR:
        return gstr(v)
    if t == ARR:
        et, elems = v
        return struct.pack("<IQ", et, len(elems)) + b"".join(payload(et, e) for e in elems)
    return struct.pack(SCALAR_FMT[t], v)


def gguf(kvs, tensors=(), version=3, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, ggml type name, dims)]. Data bytes are a
    deterministic pattern; each tensor is padded to the alignment (gguf-py layout)."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, t, v in kvs:
        out += gstr(key) + struct.pack("<I", t) + payload(t, v)
    offset, blobs = 0, []
    for name, tname, dims in tensors:
        tid, be, bb = GGML[tname]
        n = 1
        for d in dims:
            n *= d
        nbytes = n // be * bb
        out += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", tid, offset)
        blob = bytes((i * 37 + len(blobs) * 11) % 251 for i in range(nbytes))
        pad = (-nbytes) % alignment
        blobs.append(blob + b"\0" * pad)
        offset += nbytes + pad
    out += b"\0" * ((-len(out)) % alignment)
    return out + b"".join(blobs)


def main(outdir):
    os.makedirs(outdir, exist_ok=True)
    files = {
        "kv_every_type": gguf([
            ("u8", U8, 200), ("i8", I8, -5), ("u16", U16, 60000), ("i16", I16, -300),
            ("u32", U32, 4000000000), ("i32", I32, -7), ("f32", F32, 0.5), ("bool", BOOL, True),
            ("str", STR, "hello"), ("u64", U64, 2**63), ("i64", I64, -2**40), ("f64", F64, 1e-300),
            ("arr.f32", ARR, (F32, [1.0, -2.0])), ("arr.bool", ARR, (BOOL, [True, False])),
            ("arr.str", ARR, (STR, ["a", "", "bc"])),
            ("arr.nested", ARR, (ARR, [(I16, [1, -1]), (STR, ["x"])])),
        ]),
        "tensors_every_dequant_type": gguf(
            [("general.architecture", STR, "gemma4"), ("gemma4.block_count", U32, 1)],
            [("a.f32", "f32", [3]), ("b.f16", "f16", [4, 2]), ("c.bf16", "bf16", [2]),
             ("d.q8_0", "q8_0", [32]), ("e.q4_0", "q4_0", [32, 2]), ("f.q4_k", "q4_k", [256]),
             ("g.q5_k", "q5_k", [256]), ("h.q6_k", "q6_k", [256])]),
        "v2_align64": gguf(
            [("general.alignment", U32, 64), ("gemma4.feed_forward_length", ARR, (U32, [8, 16]))],
            [("w", "q8_0", [32, 1, 1, 2]), ("n", "f32", [5])], version=2, alignment=64),
        "tokenizer_like": gguf([
            ("tokenizer.ggml.model", STR, "gemma4"),
            ("tokenizer.ggml.tokens", ARR, (STR, ["<pad>", "<eos>", "<bos>", "\u2581a", "b"])),
            ("tokenizer.ggml.scores", ARR, (F32, [0.0, 0.0, 0.0, -1.5, -2.0])),
            ("tokenizer.ggml.token_type", ARR, (I32, [3, 3, 3, 1, 1])),
            ("tokenizer.ggml.bos_token_id", U32, 2)]),
        "empty": gguf([]),
    }
    for name, data in files.items():
        with open(os.path.join(outdir, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus_gguf"))
