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

The launcher (``csis-tf-supervise``, a shell script) runs ``version`` and ``output`` without
this supervisor (they read and hold no lock: nothing to stop; ``output`` through
``csis_tf_outputs.py``, which masks sensitive values in ``output -json``), and on the role's apply task
(``CSIS_TF_VALIDATED_BY_PLAN=1``) answers ``validate`` and, in the ``default`` workspace,
``workspace list`` itself (its comments say why each answer is true). Everything else, the plan
and the apply above all, runs under this supervisor.

The role runs the apply as an Ansible async task (so the run shows progress while a long
apply runs). Ansible then daemonises the module, and the ``ansible-playbook`` controller is
no longer among our ancestors: ``CSIS_TF_WATCH=<pid>:<start time>`` names it (the run lock
found it, ``csis_run_lock``). Also read from the environment:

* ``CSIS_TF_TIMEOUT`` (seconds, 0 or unset: none): terraform gets ONE SIGINT when it has run
  that long, then ``CSIS_TF_GRACE`` seconds (300) to save its state and stop, then SIGKILL.
  The exit status is then non-zero and stderr says why.
* ``CSIS_TF_LOG``: the output of ``apply`` (or ``destroy``) is copied, line by line as it
  comes, to this file (``tail -f`` it to follow a long apply); stdout and stderr still reach
  the caller whole.
* ``CSIS_TF_PUSH_WAIT`` (seconds, 120; 0: never): when an ``apply`` (or ``destroy``) failed and
  left ``errored.tfstate`` (terraform changed reality but the backend did not take the new
  state), the file is pushed to the backend (``state push``, terraform's own advice), again and
  again for up to that long while the backend refuses it, and removed once it is in. An AWX
  job's container goes with the job, and the file with it: pushed here, what the apply did is in
  the state the next plan reads. A state lock this supervisor's own terraform left (an apply lock
  taken by this user on this host between the apply's start and exit, or any lock of a push
  attempt it had to stop) is released first (``force-unlock``); any other lock is left. A refusal
  no attempt can change (another lineage, a newer state in the backend) ends the attempts, so
  does a signal (after the attempt under way). The exit status stays the apply's (it failed);
  stderr says what became of the state. A push that never succeeds leaves the file: the next plan
  of the root is refused until it is pushed (``csis_plan``).

terraform runs in a process group of its own: Ansible's async timeout kills the module's
process group with SIGKILL, which must reach the supervisor (terraform then gets its one
SIGINT from PR_SET_PDEATHSIG), never terraform itself.
"""
import calendar
import ctypes
import ctypes.util
import os
import pwd
import re
import signal
import socket
import subprocess
import sys
import threading
import time

POLL = 0.5
PR_SET_PDEATHSIG = 1
ERRORED = "errored.tfstate"
# terraform's "Lock Info:" block of a refused lock (statemgr.LockInfo.String)
LOCK_FIELD = re.compile(r"^\s*(ID|Operation|Who|Created):[ \t]*(\S.*?)[ \t]*$", re.M)


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


def _libc():
    """glibc by its soname; only elsewhere ``find_library``, which runs ``ldconfig -p`` (a process
    per terraform start)."""
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _pdeathsig():
    try:
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGINT, 0, 0, 0)
    except (OSError, AttributeError, TypeError):
        pass  # not Linux: the watch loop still stops terraform


def _watch_env():
    """[(pid, start time)] of CSIS_TF_WATCH ("<pid>:<start>"), [] when unset or malformed."""
    raw = (os.environ.get("CSIS_TF_WATCH") or "").strip()
    try:
        pid, start = raw.split(":", 1)
        return [(int(pid), start)]
    except ValueError:
        return []


def _number(name, default):
    try:
        value = float(os.environ.get(name) or default)
    except ValueError:
        value = float(default)
    return max(0.0, value)


def _me():
    """terraform's ``user@host`` for this process, as Go's ``os/user`` finds the user (the password
    database, else ``$USER``) and ``os.Hostname``."""
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = os.environ.get("USER") or ""
    return "%s@%s" % (user, socket.gethostname()) if user else None


def _own_lock(out, windows):
    """The lock's ID when terraform's refusal of a state lock (``out``) names one this supervisor's
    own terraform left: taken by this user on this host (terraform's ``user@host``) within one of
    ``windows`` (``[(operation or None, start, end)]``, epoch seconds: the failed apply, from its
    start to its exit, for an apply's lock; a push attempt that was stopped, for any). None
    otherwise: a lock of anyone else, or taken at any other time, is never released here."""
    fields = dict(LOCK_FIELD.findall("\n".join(line.strip().lstrip("\u2502") for line in out.splitlines())))
    me = _me()
    if not fields.get("ID") or not me or fields.get("Who") != me:
        return None
    try:  # Go's time.String() of a UTC time: "2026-12-07 13:50:01.123456789 +0000 UTC"
        created = calendar.timegm(time.strptime(fields.get("Created", "")[:19], "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return None
    for operation, start, end in windows:
        if (operation is None or fields.get("Operation") == operation) and int(start) - 1 <= created <= end + 1:
            return fields["ID"]
    return None


def _last_error(out):
    """terraform's error on one line, from its first ``Error``, without its box drawing and the CLI
    configuration's warnings: at most 400 characters."""
    lines = [line.strip().strip("\u2577\u2502\u2575").strip() for line in out.splitlines()]
    first = next((i for i, line in enumerate(lines) if "Error" in line or "error" in line), 0)
    text = " ".join(" ".join(lines[first:]).split())
    text = re.sub(r"RequestID: \S*,? HostID: \S*,? ", "", text)  # the endpoint's ids: noise here
    return (text[:400] + (" ..." if len(text) > 400 else "")) or "no output"


def _run(argv, timeout):
    """``(exit status, output, stopped)`` of a terraform command bounded by ``timeout`` seconds:
    past it, one SIGINT (terraform releases the state lock it holds) and 30 s to exit, then SIGKILL.
    In a process group of its own, as the apply (Ansible's SIGKILL of the module's group reaches
    this supervisor, and the child gets its SIGINT from PR_SET_PDEATHSIG)."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,  # pylint: disable=consider-using-with
                            stderr=subprocess.STDOUT, preexec_fn=_child_setup)  # pylint: disable=subprocess-popen-preexec-fn
    try:
        out, _err = proc.communicate(timeout=timeout)
        return proc.returncode, out.decode("utf-8", "replace"), False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, _err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _err = proc.communicate()
        return 1, out.decode("utf-8", "replace"), True


#: a push refused for what another attempt cannot change: another state's lineage, a newer state in
#: the backend, a file terraform cannot read
FINAL = ("lineage", "newer state with serial", "Error reading source state")


def push_errored_state(binary, started, exited, budget, note, sleep=None, stopping=lambda: None):
    """Push the ``errored.tfstate`` a failed apply left in the working directory to the backend
    (``state push``, again for up to ``budget`` seconds while it is refused), then remove it.

    ``started`` and ``exited``: epoch times of the apply's terraform. An older file is not this
    apply's (``csis_plan`` refuses the root before its plan; it is left alone here). ``note`` takes
    each line to report; ``sleep(seconds)`` waits between attempts (by default in steps, ending
    early once ``stopping()`` names a reason: a signal to this supervisor, after which no attempt
    starts). Returns True (pushed), False (not pushed: the file stays, the next plan is refused with
    the command) or None (no file of this apply)."""
    path = os.path.abspath(ERRORED)
    try:
        if os.stat(path).st_mtime < started - 1:
            return None
    except OSError:
        return None
    later = "the next plan of this root is refused until it is pushed: %s -chdir=%s state push %s, then remove it" % (
        os.path.basename(binary), os.path.dirname(path), ERRORED)
    if budget <= 0:
        note("terraform could not save the apply's state in the backend and wrote it to %s; not pushed "
             "(CSIS_TF_PUSH_WAIT=0): %s" % (path, later))
        return False

    def wait(seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end and not stopping():
            time.sleep(min(0.5, end - time.monotonic()))

    sleep = sleep or wait
    deadline = time.monotonic() + budget
    windows = [("OperationTypeApply", started, exited)]
    attempt, delay, released, last, why = 0, 5.0, set(), "", ""
    while True:
        attempt += 1
        begun = time.time()
        rc, out, stopped = _run([binary, "state", "push", "-no-color", "-lock-timeout=0s", ERRORED],
                                max(30.0, deadline - time.monotonic()))
        if stopped:
            windows.append((None, begun, time.time()))  # a lock it left is this supervisor's own
            out = "Error: terraform state push did not finish in time and was stopped. " + out
        if rc == 0:
            os.unlink(path)
            note("terraform could not save the apply's state in the backend and wrote it to %s: pushed to the "
                 "backend (attempt %d) and removed; the state the next plan reads holds what the apply did"
                 % (path, attempt))
            return True
        last = _last_error(out)
        lock_id = _own_lock(out, windows)
        if lock_id and lock_id not in released:
            released.add(lock_id)
            urc, uout, _stopped = _run([binary, "force-unlock", "-no-color", "-force", lock_id], 60.0)
            note("the state lock %s left by this supervisor's own terraform (the failed apply, or a push it "
                 "stopped): %s" % (lock_id, "released" if urc == 0 else "not released: %s" % _last_error(uout)))
            if urc == 0:
                continue
        if any(word in out for word in FINAL):
            why = "; another attempt cannot change that"
            break
        if stopping():
            why = "; no more attempts: %s" % stopping()
            break
        if time.monotonic() + delay >= deadline:
            break
        note("pushing %s to the backend failed (attempt %d%s); again in %d s"
             % (ERRORED, attempt, ": %s" % last if attempt == 1 else "", delay))
        sleep(delay)
        delay = min(delay * 2, 30.0)
        if stopping():
            why = "; no more attempts: %s" % stopping()
            break
    note("terraform could not save the apply's state in the backend and wrote it to %s; pushing it failed %d time(s) "
         "within %d s (CSIS_TF_PUSH_WAIT; the last: %s%s): %s" % (path, attempt, budget, last, why, later))
    return False


def _child_setup():
    os.setpgid(0, 0)
    _pdeathsig()


def _copy(src, dst, log, lock):
    """Copy terraform's output to our own stream and, line by line, to the log file."""
    for line in iter(src.readline, b""):
        try:
            dst.write(line)
            dst.flush()
        except (OSError, ValueError):
            pass  # our reader is gone with the run; terraform is being stopped anyway
        if log is not None:
            with lock:
                try:
                    log.write(line)
                    log.flush()
                except (OSError, ValueError):
                    pass
    src.close()


def main(argv):
    # what terraform writes here (a local backend's state, errored.tfstate) and the apply's log hold
    # the state's values, sensitive ones in clear: the owner's only (an async apply runs under
    # async_wrapper's 022 umask, whatever the operator's)
    os.umask(os.umask(0o077) | 0o077)
    binary = os.environ.get("CSIS_TF_BINARY") or "terraform"
    chain = watched() + _watch_env()
    timeout = _number("CSIS_TF_TIMEOUT", 0)
    grace = _number("CSIS_TF_GRACE", 300)
    # the apply's output only (the module's other calls around it do not come here or are not logged)
    applying = argv[:1] in (["apply"], ["destroy"])
    log_path = (os.environ.get("CSIS_TF_LOG") or "") if applying else ""
    state = {"stopping": None, "killed": False, "signal": None}
    proc = None

    def stop(why):
        if state["stopping"] is None and proc is not None and proc.poll() is None:
            state["stopping"] = (why, time.monotonic())
            _note("%s: stopping %s gracefully (SIGINT, pid %d) and waiting for it to save its state"
                  % (why, os.path.basename(binary), proc.pid))
            try:
                proc.send_signal(signal.SIGINT)
            except OSError:
                pass

    def on_signal(signum, _frame):
        # a push of errored.tfstate after it (the run is going away) makes the attempt under way, no more
        state["signal"] = "got %s" % signal.Signals(signum).name
        stop(state["signal"])

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    log = None
    if log_path:
        try:
            log = open(log_path, "wb")  # pylint: disable=consider-using-with
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            header = "--- %s %s (csis-tf-supervise, %s)\n" % (os.path.basename(binary), " ".join(argv[:1]), stamp)
            log.write(header.encode("utf-8"))
            log.flush()
        except OSError as exc:
            _note("cannot write the log %s: %s" % (log_path, exc))
            log = None
    started, started_wall = time.monotonic(), time.time()
    try:
        proc = subprocess.Popen([binary] + argv, preexec_fn=_child_setup,  # pylint: disable=subprocess-popen-preexec-fn
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        _note("cannot run %s: %s" % (binary, exc))
        return 127
    lock = threading.Lock()
    copiers = [threading.Thread(target=_copy, args=(proc.stdout, getattr(sys.stdout, "buffer", sys.stdout), log, lock)),
               threading.Thread(target=_copy, args=(proc.stderr, getattr(sys.stderr, "buffer", sys.stderr), log, lock))]
    for thread in copiers:
        thread.daemon = True
        thread.start()
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
            elif timeout and time.monotonic() - started >= timeout:
                stop("it ran longer than %d s (csis_apply_timeout)" % timeout)
        elif not state["killed"] and time.monotonic() - state["stopping"][1] >= grace:
            state["killed"] = True
            _note("%s did not stop within %d s of the SIGINT (CSIS_TF_GRACE): SIGKILL; its state may not be "
                  "saved (look for errored.tfstate in the root)" % (os.path.basename(binary), grace))
            try:
                proc.kill()
            except OSError:
                pass
    exited_wall = time.time()
    for thread in copiers:
        thread.join(timeout=5)
    if state["stopping"] is not None:
        _note("%s exited with %d after the stop (%s)" % (os.path.basename(binary), rc, state["stopping"][0]))
        if rc == 0:
            rc = 1  # stopped early: never report a finished run
    if rc != 0 and applying:
        # an apply (or destroy) that failed: the state it could not save goes to the backend now,
        # while this process still runs where terraform wrote it (an AWX job's container goes next)
        def report(msg):
            _note(msg)
            if log is not None:
                try:
                    log.write(("csis-tf-supervise: %s\n" % msg).encode("utf-8"))
                    log.flush()
                except (OSError, ValueError):
                    pass
        push_errored_state(binary, started_wall, exited_wall, _number("CSIS_TF_PUSH_WAIT", 120), report,
                           stopping=lambda: state["signal"])
    if log is not None:
        log.close()
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
