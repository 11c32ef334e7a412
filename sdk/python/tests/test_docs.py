"""The docs' Python examples, run as written against a real server: every ```python block
followed by "It prints:" and a ``` block must print exactly that. Keeps README.md,
docs/sdk.md, docs/api.md and the SDK's README true."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

from conftest import ROOT

DOCS = ["README.md", "docs/sdk.md", "docs/api.md", "sdk/python/README.md"]
# A block's text never holds a fence, so one match never spans two blocks.
_BLOCK = r"((?:(?!```)[\s\S])*)```"
EXAMPLE = re.compile(r"```python\n" + _BLOCK + r"\n\s*It prints:\s*\n\s*```[a-z]*\n" + _BLOCK)


def examples() -> List[Tuple[str, int, str, str]]:
    found = []
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        for match in EXAMPLE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((doc, line, match.group(1), match.group(2)))
    return found


def test_the_docs_have_examples() -> None:
    docs = {doc for doc, *_ in examples()}
    assert {"README.md", "docs/sdk.md", "docs/api.md", "sdk/python/README.md"} <= docs, docs


@pytest.mark.parametrize("doc, line, code, printed", [pytest.param(*e, id=f"{e[0]}:{e[1]}") for e in examples()])
def test_a_docs_example_prints_what_the_docs_say(
    local_server, tmp_path: Path, doc: str, line: int, code: str, printed: str
) -> None:
    port = local_server.host_port[1]
    code = code.replace("http://127.0.0.1:3112", local_server.base_url).replace("PORT = 3112", f"PORT = {port}")
    assert local_server.base_url in code or f"PORT = {port}" in code, f"{doc}:{line} names no server"
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDCALL_")}
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, f"{doc}:{line} failed:\n{out.stdout}\n{out.stderr}"
    assert out.stdout == printed, f"{doc}:{line} printed:\n{out.stdout}"
