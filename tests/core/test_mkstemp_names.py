"""The dir store's temporary names: random without moving the application's ``random``,
and different in a forked child."""

from __future__ import annotations

import os
import random
import stat

from yeto_core.stores import files


def test_temporary_files_leave_the_applications_seeded_random_alone(tmp_path):
    random.seed(5)
    expected = [random.random() for _ in range(3)]
    random.seed(5)
    names = set()
    for _ in range(50):
        fd, path = files.mkstemp(prefix=".x.yeto-tmp-", dir=tmp_path)
        os.close(fd)
        names.add(os.path.basename(path))
        assert stat.S_IMODE(os.stat(path).st_mode) == files.FILE_MODE
    assert [random.random() for _ in range(3)] == expected
    assert len(names) == 50


def test_a_forked_child_draws_other_names_than_its_parent():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            os.write(write, files._NAMES.getrandbits(64).to_bytes(8, "big"))
        finally:
            os._exit(0)
    os.close(write)
    child = int.from_bytes(os.read(read, 8), "big")
    os.close(read)
    os.waitpid(pid, 0)
    assert child != files._NAMES.getrandbits(64)
