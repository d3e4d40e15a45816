#!/usr/bin/env python3
"""stop_thread.py PID [WHERE...]: stop one thread, the main thread of PID,
and only that one, inside the program's own code.

SIGSTOP stops every thread of a process; a rank whose main thread is stuck
in its own work still has a watcher thread that runs and answers. To be
that rank, this seizes the thread with ptrace (PTRACE_SEIZE, which sends
no signal) and interrupts it (PTRACE_INTERRUPT): the thread stops where it
is, its siblings run on.

Where it stops matters: a thread stopped inside the MPI library may hold
the library's locks, and then no thread of the process gets through an
MPI call. So the stop is kept only where the thread's instruction pointer
(/proc/PID/task/PID/syscall gives it for a stopped thread) lies in a file
whose path contains one of WHERE (default: the process's executable);
otherwise the thread is let go (PTRACE_DETACH) and stopped again a few
milliseconds later, up to 500 times.

The stop lasts while this process lives: it prints "stopped in FILE" once
the thread is held there, then waits until the process ends (the job
ended) or it is killed. Exit status 2 where ptrace is not allowed here
(EPERM, EACCES on the first seize) or the thread never stopped in WHERE:
the caller then skips its check, saying why. Any other failure (the
thread gone: the job ended before it could be stopped) is status 1, a
failure.
"""
import errno
import ctypes
import os
import random
import sys
import time

PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207


def give_up(why, status=1):
    print(f"stop_thread: {why}", file=sys.stderr)
    sys.exit(status)


def stopped_pc(tid):
    """The stopped thread's instruction pointer, or None while it runs."""
    with open(f"/proc/{tid}/task/{tid}/syscall") as f:
        fields = f.read().split()
    if not fields or fields[0] == "running":
        return None
    return int(fields[-1], 16)


def file_at(pid, pc):
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= pc < hi:
                return parts[5].strip() if len(parts) == 6 else ""
    return ""


def main():
    pid = int(sys.argv[1])
    where = sys.argv[2:] or [os.path.realpath(f"/proc/{pid}/exe")]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p,
                            ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    libc.waitpid.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                             ctypes.c_int]

    def ptrace(request, what, data=0, first=False):
        if libc.ptrace(request, pid, None, ctypes.c_void_p(data)) != 0:
            e = ctypes.get_errno()
            give_up(f"ptrace ({what}) on thread {pid}: {os.strerror(e)}",
                    2 if first and e in (errno.EPERM, errno.EACCES) else 1)

    status = ctypes.c_int()
    for attempt in range(500):
        ptrace(PTRACE_SEIZE, "seize", first=attempt == 0)
        ptrace(PTRACE_INTERRUPT, "interrupt")
        # __WALL: the main thread of another process, traced by this one
        if libc.waitpid(pid, ctypes.byref(status), 0x40000000) != pid:
            give_up(f"waitpid on thread {pid}: "
                    f"{os.strerror(ctypes.get_errno())}")
        if not os.WIFSTOPPED(status.value):
            give_up(f"thread {pid} ended before it could be stopped")
        # a stop for a signal (no ptrace event in the high bits) hands the
        # signal back on release; the interrupt's own stop has none
        signal = os.WSTOPSIG(status.value) if status.value >> 16 == 0 else 0
        pc = stopped_pc(pid)
        path = file_at(pid, pc) if pc is not None else ""
        if any(w in path for w in where):
            print(f"stopped in {os.path.basename(path)}", flush=True)
            # held until the process ends; its end is reported here first
            # (the tracer's), and passed on to its parent once reaped
            while libc.waitpid(pid, ctypes.byref(status), 0x40000000) == pid:
                if os.WIFEXITED(status.value) or os.WIFSIGNALED(status.value):
                    return
            return
        ptrace(PTRACE_DETACH, "detach", signal)
        time.sleep(random.uniform(0.001, 0.02))
    give_up(f"thread {pid} never stopped in {' or '.join(where)}", 2)


if __name__ == "__main__":
    main()
