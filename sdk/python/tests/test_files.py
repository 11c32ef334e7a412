"""Files in and out through the SDK: uploads (explicit, or made by run/exec from local
files), output files with their download helpers, listing and deleting."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandcall import APIError, File, Sandcall

REPORT = "\n".join(
    [
        "import csv",
        "totals = {}",
        "for row in csv.DictReader(open('in/data.csv')):",
        "    totals[row['region']] = totals.get(row['region'], 0) + int(row['amount'])",
        "with open('report.txt', 'w') as out:",
        "    for region, total in sorted(totals.items()):",
        "        print(region, total * scale(), file=out)",
        "print(open('notes.txt').read().strip())",
    ]
)

CSV = "region,amount\nnorth,120\nsouth,80\nnorth,45\n"


def test_run_uploads_local_files_and_returns_the_outputs(client: Sandcall, tmp_path: Path) -> None:
    result = client.run(
        REPORT,
        tools={"scale": lambda: 2},
        files={"in/data.csv": CSV, "notes.txt": b"from bytes\n"},
    )
    assert result.status == "completed", result
    assert result.stdout == "from bytes\n", result.stderr
    by_name = {f.name: f for f in result.files}
    assert by_name["in/data.csv"].inherited and by_name["notes.txt"].inherited
    report = by_name["report.txt"]
    assert isinstance(report, File) and not report.inherited
    assert report.storage_session_id == result.session_id
    assert report.download() == b"north 330\nsouth 160\n"
    saved = report.save(tmp_path)
    assert saved == tmp_path / "report.txt" and saved.read_bytes() == b"north 330\nsouth 160\n"
    assert report.save(tmp_path / "copy.txt").read_bytes() == b"north 330\nsouth 160\n"

    # The session's files, listed, then one deleted.
    listed = client.files(result.session_id)
    assert [(f.id, f.name, f.size) for f in listed] == [(report.id, "report.txt", 20)]
    client.delete_file(report)
    assert client.files(result.session_id) == []
    with pytest.raises(APIError) as refused:
        report.download()
    assert (refused.value.status_code, refused.value.error_type) == (404, "file_not_found")


def test_uploaded_files_are_named_as_inputs_of_exec(client: Sandcall, tmp_path: Path) -> None:
    local = tmp_path / "data.csv"
    local.write_text(CSV)
    stored = client.upload([local, ("skill/run.py", "print('hi from run.py')\n")], kind="user", entity_id="u1")
    assert [f.name for f in stored] == ["data.csv", "skill/run.py"]
    assert len({f.storage_session_id for f in stored}) == 1
    assert stored[0].size == len(CSV)
    assert client.download(stored[0].storage_session_id, stored[0].id) == CSV.encode()

    result = client.exec(
        "import runpy\nrunpy.run_path('skill/run.py')\nprint(len(open('input.csv').readlines()))\n"
        "open('out.bin', 'wb').write(bytes(range(256)))",
        files=[stored[0].ref("input.csv"), stored[1], local],
    )
    assert result.status == "ok", result.stderr
    assert result.stdout == "hi from run.py\n4\n"
    out = [f for f in result.files if f.name == "out.bin"][0]
    assert out.download() == bytes(range(256))
    assert {f.name for f in result.files if f.inherited} == {"input.csv", "skill/run.py", "data.csv"}


def test_a_file_path_upload_streams_from_disk(client: Sandcall, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * (3 << 20))
    [stored] = client.upload(big)
    assert stored.size == 3 << 20
    target = client.download_to(stored, tmp_path / "back.bin")
    assert target.stat().st_size == 3 << 20
