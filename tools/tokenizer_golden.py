#!/usr/bin/env python3
"""Golden token ids for the Gemma 4 tokenizer from Hugging Face `tokenizers`.

Builds a `tokenizers` BPE model from a vocabulary exported by gemmajit
(`gemmajit tokenize --synthetic-vocab 4096 --seed 3 --export-vocab ...`) with the Gemma 4 scheme:
  - CONTROL, UNKNOWN and USER_DEFINED tokens are added tokens (special, not normalized), matched
    leftmost-longest before anything else;
  - normalizer: every " " becomes "\u2581" (no prefix space, nothing else);
  - pre-tokenizer: runs of newlines split off (isolated), everything else stays one piece;
  - BPE by merge rank over characters, byte_fallback to <0xXX>, ignore_merges off;
  - decoder: "\u2581" -> " ", byte fallback, fuse.
and records, for every text in tests/data/tokenizer/cases.json, the ids (no BOS) and the decoded
text. test_tokenizer_golden requires engine/text/tokenizer.cpp to reproduce them exactly.

Known difference, by design: llama.cpp (and gemmajit) emit a pure newline run that is a vocabulary
token whole even when no merge sequence builds it; stock BPE can only do that with ignore_merges,
which would apply to every piece. The synthetic vocabularies build every newline run by merges,
so both agree here; test_tokenizer covers the rule itself.

Usage:
  tools/tokenizer_golden.py derive            # vocab_shuffled_4096.json (no tokenizers needed)
  tools/tokenizer_golden.py golden [--out F]  # needs `tokenizers`; writes golden.json
"""
import argparse
import hashlib
import json
import pathlib
import random
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "tokenizer"
BASE_VOCAB = "vocab_synthetic_4096.json"
SHUFFLED_VOCAB = "vocab_shuffled_4096.json"
CONTROL, UNKNOWN, USER_DEFINED = 3, 2, 4


def split_merge(m):
    # As llama.cpp: the first space after the first character separates the parts.
    i = m.index(" ", 1)
    return m[:i], m[i + 1:]


def derive_shuffled():
    """Same tokens, non-newline merges in a seeded random order: a vocabulary whose merge ranks
    are unrelated to how its tokens were built, to stress rank order and tie-breaking. Newline
    merges keep their ranks so every newline run stays reachable by BPE (see the module doc)."""
    v = json.loads((DATA / BASE_VOCAB).read_text(encoding="utf-8"))
    merges = v["merges"]
    newline = {i for i, m in enumerate(merges) if set(m.replace(" ", "", 1)) == {"\n"}}
    rest = [m for i, m in enumerate(merges) if i not in newline]
    random.Random(20240601).shuffle(rest)
    it = iter(rest)
    out = [merges[i] if i in newline else next(it) for i in range(len(merges))]
    v["merges"] = out
    (DATA / SHUFFLED_VOCAB).write_text(json.dumps(v, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {DATA / SHUFFLED_VOCAB}")


def build_tokenizer(v):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {}
    for i, t in enumerate(v["tokens"]):
        vocab.setdefault(t, i)
    kwargs = dict(vocab=vocab, merges=[split_merge(m) for m in v["merges"]],
                  unk_token=v["tokens"][v["unk_id"]], byte_fallback=True, fuse_unk=False)
    try:
        bpe = models.BPE(ignore_merges=False, **kwargs)
    except TypeError:  # releases before ignore_merges existed never ignore merges
        bpe = models.BPE(**kwargs)
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("\n+"), behavior="isolated")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    special = [AddedToken(t, special=True, normalized=False)
               for t, ty in zip(v["tokens"], v["types"]) if ty in (CONTROL, UNKNOWN, USER_DEFINED)]
    tok.add_special_tokens(special)
    return tok


def golden(out_path):
    import tokenizers

    cases = json.loads((DATA / "cases.json").read_text(encoding="utf-8"))
    result = {"tokenizers_version": tokenizers.__version__, "vocabularies": {}}
    for name in (BASE_VOCAB, SHUFFLED_VOCAB):
        raw = (DATA / name).read_bytes()
        v = json.loads(raw)
        tok = build_tokenizer(v)
        rows = []
        for text in cases:
            ids = tok.encode(text, add_special_tokens=False).ids
            rows.append({"text": text, "ids": ids,
                         "decoded": tok.decode(ids, skip_special_tokens=False)})
        result["vocabularies"][name] = {"sha256": hashlib.sha256(raw).hexdigest(), "cases": rows}
    pathlib.Path(out_path).write_text(json.dumps(result, ensure_ascii=False, indent=1) + "\n",
                                      encoding="utf-8")
    print(f"wrote {out_path}: {len(cases)} texts x 2 vocabularies, tokenizers {tokenizers.__version__}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=["derive", "golden"])
    ap.add_argument("--out", default=str(DATA / "golden.json"))
    args = ap.parse_args()
    if args.step == "derive":
        derive_shuffled()
    else:
        golden(args.out)


if __name__ == "__main__":
    sys.exit(main())
