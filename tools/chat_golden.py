#!/usr/bin/env python3
"""Renders the conversations in tests/data/chat/cases.json with the public Gemma 4 chat template
(tests/data/chat/gemma4.jinja, llama.cpp's models/templates/gemma4.jinja) using jinja2 configured
as Hugging Face's apply_chat_template does (trim_blocks, lstrip_blocks, loopcontrols), and writes
the rendered prompts to tests/data/chat/golden.json. test_chat_format requires engine/chat_format
to reproduce every one byte for byte.

Usage: python3 tools/chat_golden.py [--check]   (--check: compare instead of writing)
"""
import argparse
import json
import pathlib
import sys

import jinja2
import jinja2.ext
import jinja2.sandbox

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "chat"


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    return env


def render_all():
    template = make_env().from_string((DATA / "gemma4.jinja").read_text(encoding="utf-8"))
    cases = json.loads((DATA / "cases.json").read_text(encoding="utf-8"))
    golden = {}
    for case in cases:
        name = case["name"]
        if name in golden:
            sys.exit(f"duplicate case name {name}")
        golden[name] = template.render(
            messages=case["messages"],
            add_generation_prompt=case.get("add_generation_prompt", True),
            enable_thinking=case.get("enable_thinking", False),
            tools=case.get("tools"),
            bos_token="<bos>",
            eos_token="<eos>",
        )
    return golden


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with golden.json, write nothing")
    args = ap.parse_args()
    golden = render_all()
    out = DATA / "golden.json"
    text = json.dumps(golden, ensure_ascii=False, indent=1) + "\n"
    if args.check:
        if out.read_text(encoding="utf-8") != text:
            sys.exit(f"{out} is out of date; rerun tools/chat_golden.py")
        print(f"{out}: {len(golden)} cases up to date")
        return
    out.write_text(text, encoding="utf-8")
    print(f"wrote {len(golden)} rendered conversations to {out}")


if __name__ == "__main__":
    main()
