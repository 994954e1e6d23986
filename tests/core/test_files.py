"""The run folder's files are written atomically and never through a symbolic link: a link
at the file's name or at its temporary's is replaced, what it points to left as it was,
and each one found is said in one line."""

import os

import pytest

from compress.core import console
from compress.core.files import open_no_follow, real_folder, write_file


@pytest.fixture
def lines(monkeypatch):
    said = []
    monkeypatch.setattr(console, "log", said.append)
    return said


@pytest.fixture
def outside(tmp_path):
    """A file outside the run folder that links point at, and the run folder."""
    target = tmp_path / "outside.txt"
    target.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    return target, run


def test_a_link_at_the_file_or_its_temporary_is_replaced_not_written_through(outside, lines):
    target, run = outside
    (run / "report.md").symlink_to(target)
    (run / "report.md.part").symlink_to(target)
    write_file(run / "report.md", "new")
    assert target.read_text() == "precious"
    assert not (run / "report.md").is_symlink() and (run / "report.md").read_text() == "new"
    assert not (run / "report.md.part").exists()
    assert len(lines) == 2 and all("was a symbolic link" in ln and str(target) in ln for ln in lines)

    (run / "card.part").symlink_to(target)  # a temporary of another name, and bytes
    write_file(run / "card", b"\x00\x01", tmp=run / "card.part")
    assert target.read_text() == "precious" and (run / "card").read_bytes() == b"\x00\x01"

    (run / "dangling.part").symlink_to(run / "nowhere")  # a link to nothing is not created through either
    write_file(run / "dangling", "x")
    assert not (run / "nowhere").exists() and (run / "dangling").read_text() == "x"


def test_no_link_no_line_and_a_leftover_temporary_is_replaced(outside, lines):
    _, run = outside
    (run / "manifest.json.part").write_text("half a file from a killed run")
    write_file(run / "manifest.json", "{}")
    write_file(run / "manifest.json", "{}\n")
    assert (run / "manifest.json").read_text() == "{}\n" and not lines
    assert sorted(p.name for p in run.iterdir()) == ["manifest.json"]


def test_a_folder_that_is_a_link_becomes_a_folder_of_its_own(tmp_path, lines):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "kept").write_text("x")
    (tmp_path / "bench").symlink_to(elsewhere)
    folder = real_folder(tmp_path / "bench")
    assert folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir())
    assert (elsewhere / "kept").read_text() == "x" and len(lines) == 1


def test_open_no_follow_replaces_a_link(outside, lines):
    target, run = outside
    (run / ".lock").symlink_to(target)
    fd = open_no_follow(run / ".lock")
    os.write(fd, b"123")
    os.close(fd)
    assert target.read_text() == "precious" and (run / ".lock").read_text() == "123"
    assert not (run / ".lock").is_symlink() and len(lines) == 1
