"""An operator that hunts for its wrapper's secrets (standard library only: it runs under any
interpreter, as any user).

It reads the task line, takes the strings to look for from `config.needles`, and searches: its own
environment, its parent's (the wrapper's) `/proc/<ppid>/environ`, `cmdline` and `mem` (every
readable mapping of `maps`), the parent's open file descriptors (`/proc/<ppid>/fd`), and its own
open file descriptors other than its three pipes. Its result payload lists what it found where
(`found`: must stay empty), what each place answered (`places`), the descriptors it inherited
beyond its pipes (`extra_fds`), and who and where it is (`uid`, `home`, `cwd`, `scratch_mode`).
"""

from __future__ import annotations

import json
import os
import stat
import sys


def hunt(data: bytes, needles: list[bytes]) -> list[int]:
    return [i for i, needle in enumerate(needles) if needle in data]


def read(path: str, limit: int = 1 << 20) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(limit)


def search_memory(pid: int, needles: list[bytes]) -> tuple[str, list[int]]:
    maps = read(f"/proc/{pid}/maps").decode().splitlines()
    hits: set[int] = set()
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            # Writable private mappings: the heap, the stack and anonymous memory, where a
            # process keeps what it read (its libraries' code holds no secret).
            if not fields[1].startswith("rw") or end - start > (64 << 20):
                continue
            try:
                mem.seek(start)
                hits.update(hunt(mem.read(end - start), needles))
            except (OSError, OverflowError, ValueError):
                continue
            if len(hits) == len(needles):
                break
    return "read", sorted(hits)


def main() -> None:
    task = json.loads(sys.stdin.readline())
    needles = [n.encode() for n in task["config"]["needles"]]
    parent = os.getppid()
    found: list[str] = []
    places: dict[str, str] = {}

    def check(place: str, probe: object) -> None:
        try:
            result = probe() if callable(probe) else probe
        except PermissionError:
            places[place] = "denied"
            return
        except OSError as exc:
            places[place] = f"error {exc.errno}"
            return
        if isinstance(result, tuple):
            places[place], hits = result
        else:
            places[place], hits = "read", hunt(result, needles)
        found.extend(f"{place}#{i}" for i in hits)

    own_env = "\0".join(f"{k}={v}" for k, v in os.environ.items()).encode()
    check("own_environ", own_env)
    check("own_proc_environ", lambda: read("/proc/self/environ"))
    check("parent_environ", lambda: read(f"/proc/{parent}/environ"))
    check("parent_cmdline", lambda: read(f"/proc/{parent}/cmdline"))
    check("parent_mem", lambda: search_memory(parent, needles))

    def parent_fds() -> tuple[str, list[int]]:
        hits: set[int] = set()
        for name in os.listdir(f"/proc/{parent}/fd"):
            path = f"/proc/{parent}/fd/{name}"
            try:
                if stat.S_ISREG(os.stat(path).st_mode):  # a pipe or socket would block a read
                    hits.update(hunt(read(path, 1 << 16), needles))
            except OSError:
                continue
        return "read", sorted(hits)

    check("parent_fds", parent_fds)
    listing = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
    extra_fds = {}
    for name in os.listdir(listing):
        fd = int(name)
        if fd in (0, 1, 2, listing):
            continue
        try:
            extra_fds[name] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed meanwhile (listdir's own descriptor)
    os.close(listing)
    for name in extra_fds:
        check(f"own_fd_{name}", lambda name=name: os.pread(int(name), 1 << 16, 0))
    cwd = os.getcwd()
    payload = {
        "found": found,
        "places": places,
        "extra_fds": extra_fds,
        "uid": os.getuid(),
        "parent_uid": os.stat(f"/proc/{parent}").st_uid,
        "home": os.environ.get("HOME"),
        "tmpdir": os.environ.get("TMPDIR"),
        "cwd": cwd,
        "scratch_mode": oct(stat.S_IMODE(os.stat(cwd).st_mode)),
        "scratch_owner": os.stat(cwd).st_uid,
        "capability_token": os.environ.get("TASKPLAT_CAPABILITY_TOKEN"),
    }
    print(json.dumps({"status": "succeeded", "payload": payload}), flush=True)


if __name__ == "__main__":
    main()
