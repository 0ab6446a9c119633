"""Files the user names (--markdown, --plot, goldens -o): a regular file or a new path is
replaced atomically; a symlink's target is written and the link kept; FIFOs, character devices
and our own standard streams are written through; a block device or socket is refused. Every
failure is one `error:` line."""

import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from crafted import write_goldens
from typer.testing import CliRunner

from kolibri_cli.cli import app
from kolibri_cli.errors import KolibriError
from kolibri_cli.store.atomic import write_text_atomic


def probe_markdown(goldens: Path, target) -> object:
    return CliRunner().invoke(app, ["probe", "--goldens", str(goldens), "--k", "3", "--window",
                                    "1-2", "--markdown", str(target)])


def one_error_line(result) -> str:
    lines = result.stderr.splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: "), (
        result.exit_code, result.stderr, result.exception)
    return lines[0]


def test_regular_file_is_replaced_atomically(tmp_path):
    target = tmp_path / "report.md"
    target.write_text("old")
    target.chmod(0o640)
    result = probe_markdown(write_goldens(tmp_path / "g.jsonl"), target)
    assert result.exit_code == 0, result.output
    assert target.read_text().startswith("# kolibri probe")
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # the file's own mode kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.jsonl", "report.md"]


def unblock(fifo: Path) -> None:
    """Open the FIFO for writing once, so a reader still waiting (the write went elsewhere)
    returns instead of hanging the test run."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def test_fifo_is_written_through_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    result = probe_markdown(write_goldens(tmp_path / "g.jsonl"), fifo)
    reader.join(timeout=10)
    unblock(fifo)
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert got and got[0].startswith(b"# kolibri probe")


def test_symlink_target_is_written_and_the_link_kept(tmp_path):
    (tmp_path / "reports").mkdir()
    target = tmp_path / "reports" / "real.md"
    target.write_text("old")
    link = tmp_path / "latest.md"
    link.symlink_to(target)
    dangling = tmp_path / "new.md"
    dangling.symlink_to(tmp_path / "reports" / "created.md")
    goldens = write_goldens(tmp_path / "g.jsonl")
    assert probe_markdown(goldens, link).exit_code == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text().startswith("# kolibri probe")
    assert probe_markdown(goldens, dangling).exit_code == 0
    assert dangling.is_symlink() and (tmp_path / "reports" / "created.md").is_file()
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == ["created.md", "real.md"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_character_devices_are_written_through_never_replaced(tmp_path):
    """Private device nodes with /dev/null's and /dev/full's numbers: the first takes the report,
    the second refuses it with one line; both stay devices. Never the real /dev/null or
    /dev/full: as root, a regression would turn the machine's own into regular files."""
    null, full = tmp_path / "null", tmp_path / "full"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.mknod(full, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    goldens = write_goldens(tmp_path / "g.jsonl")
    assert probe_markdown(goldens, null).exit_code == 0
    line = one_error_line(probe_markdown(goldens, full))
    assert f"cannot write {full}: No space left on device" in line
    for dev in (null, full):
        assert stat.S_ISCHR(dev.lstat().st_mode)


def test_standard_stream_paths_name_our_descriptors():
    from kolibri_cli.store.atomic import _stream_fd

    assert [_stream_fd(Path(p)) for p in ("/dev/stdout", "/dev/stderr", "/dev/fd/1",
                                          "/proc/self/fd/2", f"/proc/{os.getpid()}/fd/1")] == [
        1, 2, 1, 2, 1]
    assert _stream_fd(Path("/proc/1/fd/1")) is None and _stream_fd(Path("/dev/null")) is None


def test_dev_fd_1_shares_the_stream_with_the_tables(tmp_path):
    """A real process whose stdout is a regular file: the report goes through fd 1, so the file
    is not replaced (the shell's redirection still holds) and the tables printed after it follow
    it instead of overwriting it. (/dev/fd/1 rather than /dev/stdout: as root, a regression
    must fail here, not replace the machine's /dev/stdout.)"""
    goldens = write_goldens(tmp_path / "g.jsonl")
    out = tmp_path / "out.txt"
    with open(out, "wb") as f:
        inode = os.fstat(f.fileno()).st_ino
        proc = subprocess.run([sys.executable, "-m", "kolibri_cli", "probe", "--goldens",
                               str(goldens), "--k", "3", "--window", "1-2", "--markdown",
                               "/dev/fd/1"], stdout=f, stderr=subprocess.PIPE, text=True)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert out.stat().st_ino == inode
    assert text.startswith("# kolibri probe") and "## Per golden" in text
    assert "per golden" in text[text.index("## Per golden"):]  # the table, after the report


def test_block_devices_sockets_and_folders_are_refused(tmp_path):
    sock_path = tmp_path / "s.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock_path))
    try:
        with pytest.raises(KolibriError, match="it is a socket"):
            write_text_atomic(sock_path, "x")
    finally:
        server.close()
    with pytest.raises(KolibriError, match="it is a folder"):
        write_text_atomic(tmp_path, "x")
    if os.geteuid() == 0:
        block = tmp_path / "loop"
        os.mknod(block, 0o600 | stat.S_IFBLK, os.makedev(7, 200))
        with pytest.raises(KolibriError, match="it is a block device"):
            write_text_atomic(block, "x")
        assert stat.S_ISBLK(block.lstat().st_mode)


def test_write_errors_are_one_line(tmp_path):
    goldens = write_goldens(tmp_path / "g.jsonl")
    loop = tmp_path / "loop.md"
    loop.symlink_to(loop)
    assert "cannot write" in one_error_line(probe_markdown(goldens, loop))
    file = tmp_path / "file"
    file.write_text("x")
    assert "cannot write" in one_error_line(probe_markdown(goldens, file / "under-a-file.md"))
    assert file.read_text() == "x"


def test_goldens_output_follows_the_same_rules(tmp_path, monkeypatch):
    """`goldens record -o` saves through write_text_atomic: a FIFO is written through."""
    from crafted import golden_line

    from kolibri_cli.goldens.chains import Golden, save_goldens

    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    fields = golden_line()
    save_goldens(fifo, [Golden(**fields)])
    reader.join(timeout=10)
    unblock(fifo)
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and '"id": "g1"' in got[0]


def test_a_fifo_no_process_reads_is_refused_before_the_work(tmp_path):
    """`--markdown FIFO` with no reader blocked for ever after the run (in a child process here,
    so that a regression fails by its timeout instead of hanging the session)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    goldens = write_goldens(tmp_path / "g.jsonl")
    out = subprocess.run([sys.executable, "-m", "kolibri_cli", "probe", "--goldens", str(goldens),
                          "--rows", str(tmp_path / "rows.jsonl"), "--markdown", str(fifo)],
                         capture_output=True, text=True, timeout=60,
                         env=os.environ | {"KOLIBRI_HOME": str(tmp_path / "home")})
    lines = out.stderr.splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    assert f"cannot write {fifo}: it is a FIFO that no process reads" in lines[0]
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and not (tmp_path / "rows.jsonl").exists()
