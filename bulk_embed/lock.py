"""One writer per output: `OUTPUT.lock`, an exclusive flock(2) held by the job's own process for its whole life.

The kernel drops the lock when its holder dies, however it dies, so a killed job never leaves a stale lock behind,
and a job still running (the make wrapper killed, not the job) keeps its output to itself: a second job on the same
output, a resume included, refuses in one line naming the holder's PID before it touches anything (its parts, the
output, the rejects file). The file holds the holder's PID for that line; it is removed when its job ends, and a job
that locked a file already unlinked takes the new one instead (two jobs never hold two files of one name)."""
import fcntl
import os


class OutputLock:
    def __init__(self, output):
        self.path = output + ".lock"
        self.fd = None

    def acquire(self):
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise SystemExit(f"embed: {self.path[:-5]} is being written by another embed job (PID {holder}); "
                                 f"one job writes an output at a time: wait for it, or stop it and run this "
                                 f"command again to go on from its finished windows") from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # its holder removed it as we opened it: lock the one that is there now
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def release(self):
        if self.fd is None:
            return
        try:
            os.unlink(self.path)
        finally:
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
