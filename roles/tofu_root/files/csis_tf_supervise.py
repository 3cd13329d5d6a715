# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Run terraform (or tofu) so that it never outlives the Ansible run that started it.

The role passes ``csis-tf-supervise`` (the shell launcher beside this file, which runs it
with ``CSIS_TF_PYTHON``, the controller's Python) as ``binary_path`` of
``community.general.terraform`` for the plan and the apply, with the real binary in
``CSIS_TF_BINARY``; every argument is passed through unchanged, as are stdin, stdout,
stderr and the exit code.

Why: Ansible's worker runs each task in a session of its own, so killing the
``ansible-playbook`` process group (Ctrl-C aside: SIGKILL, a lost controller, a cancelled
job) leaves the module and terraform running; the apply would finish detached and
nothing would record it. This supervisor watches the processes that started it, up to
and including the ``ansible-playbook`` controller: when any of them is gone, or when the
supervisor itself gets SIGINT, SIGTERM or SIGHUP, it sends terraform ONE SIGINT (terraform
then stops gracefully: it lets the resource operations in flight finish, saves the state
and releases the state lock) and waits for terraform to exit. terraform also gets SIGINT
if the supervisor itself dies (Linux PR_SET_PDEATHSIG). It never sends a second SIGINT
(that makes terraform exit at once, without saving the state).
"""
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys

POLL = 0.5
PR_SET_PDEATHSIG = 1


def _note(msg):
    try:
        sys.stderr.write("csis-tf-supervise: %s\n" % msg)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # the reader of our stderr may be gone with the run


def _stat(pid):
    """(ppid, start time) of a live process, or None."""
    try:
        with open("/proc/%d/stat" % pid, "r", encoding="utf-8", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), fields[19]


def _is_playbook(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            argv = [a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return False
    return any(os.path.basename(a).startswith("ansible-playbook") for a in argv[:2])


def watched():
    """[(pid, start time)] from our parent up to the ansible-playbook controller (the
    worker forked by the controller runs ansible-playbook's argv too: the controller is
    the last of those in a row). Without ansible-playbook among the ancestors: the parent."""
    chain = []
    pid = os.getppid()
    while pid > 1:
        st = _stat(pid)
        if st is None:
            break
        chain.append((pid, st[1], _is_playbook(pid)))
        pid = st[0]
    end = None
    for i, (_pid, _start, playbook) in enumerate(chain):
        if playbook:
            end = i
        elif end is not None:
            break
    keep = chain[: end + 1] if end is not None else chain[:1]
    return [(pid, start) for pid, start, _pb in keep]


def gone(chain):
    for pid, start in chain:
        st = _stat(pid)
        if st is None or st[1] != start:
            return pid
    return None


def _pdeathsig():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGINT, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the watch loop still stops terraform


def main(argv):
    binary = os.environ.get("CSIS_TF_BINARY") or "terraform"
    chain = watched()
    state = {"stopping": None}
    proc = None

    def stop(why):
        if state["stopping"] is None and proc is not None and proc.poll() is None:
            state["stopping"] = why
            _note("%s: stopping %s gracefully (SIGINT, pid %d) and waiting for it to save its state"
                  % (why, os.path.basename(binary), proc.pid))
            try:
                proc.send_signal(signal.SIGINT)
            except OSError:
                pass

    def on_signal(signum, _frame):
        stop("got %s" % signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        proc = subprocess.Popen([binary] + argv, preexec_fn=_pdeathsig)  # pylint: disable=subprocess-popen-preexec-fn
    except OSError as exc:
        _note("cannot run %s: %s" % (binary, exc))
        return 127
    while True:
        try:
            rc = proc.wait(timeout=POLL)
            break
        except subprocess.TimeoutExpired:
            pass
        if state["stopping"] is None:
            pid = gone(chain)
            if pid is not None:
                stop("the run that started it is gone (process %d ended)" % pid)
    if state["stopping"] is not None:
        _note("%s exited with %d after the stop" % (os.path.basename(binary), rc))
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
