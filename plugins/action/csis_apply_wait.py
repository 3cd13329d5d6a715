# -*- coding: utf-8 -*-
# Copyright: csis.infra contributors
# Apache License 2.0 (see LICENSE)
"""Action plugin of csis.infra.csis_apply_wait (documentation: plugins/modules/csis_apply_wait.py).

Waits on the controller for an async job that a task started with ``poll: 0`` on a host whose
connection is local (the csis.infra root hosts): it reads the job's results file every 0.2
s (no module run per look, unlike ``async_status``, so the wait costs no processes and
ends at most 0.2 s after the job) and prints a progress line every ``interval``
seconds with the last line of ``log`` (terraform's output as it comes). Every two seconds
while the job says "started" it looks whether a process of the job still lives
(module_utils/csis/apply/asyncjob.py): a job killed before it wrote its result fails the task
within seconds, naming the job, instead of waiting out ``timeout``."""
from __future__ import annotations

import os
import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.csis.infra.plugins.module_utils.csis.apply import asyncjob
from ansible_collections.csis.infra.plugins.module_utils.csis.apply.plan_verdict import masked_outputs

display = Display()

LOOK = 0.2
#: seconds between two looks at whether a process of the job still lives (while it says "started")
ALIVE_EVERY = 2.0


def _last_line(path):
    """The last non-empty line of ``path`` (its tail only), '' when there is none."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 4096))
            tail = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("job", "log", "interval", "timeout", "label", "unseen_grace"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # unused
        args = self._task.args
        job = args.get("job")
        if not isinstance(job, dict) or not job.get("results_file") or not job.get("ansible_job_id"):
            raise AnsibleActionFail("job must be the registered result of a task started with async and poll: 0 "
                                    "(it has ansible_job_id and results_file)")
        if self._connection.transport not in ("local", "ansible.builtin.local"):
            raise AnsibleActionFail("csis_apply_wait reads the job's results file on the controller: the host must "
                                    "use the local connection (connection: %s)" % self._connection.transport)
        path = job["results_file"]
        try:
            interval = max(1.0, float(args.get("interval", 15)))
            timeout = max(0.0, float(args.get("timeout", 0)))
        except (TypeError, ValueError) as exc:
            raise AnsibleActionFail("interval and timeout must be numbers: %s" % exc) from exc
        # type: path, as the module documents it (no argument spec reads this action's options)
        log = os.path.expanduser(os.path.expandvars(str(args.get("log")))) if args.get("log") else ""
        label = args.get("label") or self._task.get_name()
        started = time.monotonic()
        next_line = started + interval
        next_alive = started  # the first look at once: the job's processes are there to be seen
        watch = asyncjob.JobWatch(str(job["ansible_job_id"]))
        first = True
        while True:
            data = asyncjob.read_results(path)
            if asyncjob.finished(data):
                break  # the module's result (or async_wrapper's failure): the job is done
            now = time.monotonic()
            if now >= next_alive:
                next_alive = now + ALIVE_EVERY
                alive = watch.alive()
                # a job none of whose processes was ever seen (gone before the first look) is lost
                # once its command has still not begun well after "started" (asyncjob.UNSEEN_GRACE)
                if alive is False or (alive is None and watch.unseen()
                                      and asyncjob.unseen_and_never_began(path, log, self._grace(args))):
                    data = asyncjob.read_results(path)  # it may have written its result, then exited
                    if asyncjob.finished(data):
                        break
                    began = not asyncjob.never_began(path, log)
                    self._forget(path)
                    message = asyncjob.gone_message(label, job["ansible_job_id"], path, data, log, began)
                    if not began:  # nothing ran: the role may start the same plan file once more
                        result.update(failed=True, msg=message, never_began=True)
                        return result
                    raise AnsibleActionFail(message)
            if timeout and now - started > timeout:
                raise AnsibleActionFail("%s: the job %s did not finish within %d s" % (label, job["ansible_job_id"], timeout))
            if now >= next_line:
                last = _last_line(log) if log else ""
                follow = " (follow it: tail -f %s)" % log if log and first else ""
                tail = (": " + last) if last else ""
                display.display("%s still running after %d s%s%s" % (label, now - started, follow, tail))
                first = False
                next_line = now + interval
            time.sleep(LOOK)
        self._forget(path)
        for key in ("started", "finished", "results_file"):
            data.pop(key, None)
        data.pop("_ansible_suppress_tmpdir_delete", None)
        data.pop("diff", None)  # the plan's raw before/after values (csis_apply_start runs the module without diff)
        if "outputs" in data:  # community.general.terraform's output -json: sensitive values in clear
            data["outputs"] = masked_outputs(data["outputs"])
        result.update(data)
        result["seconds"] = round(time.monotonic() - started, 1)
        return result

    @staticmethod
    def _grace(args):
        try:
            return max(0.0, float(args.get("unseen_grace", asyncjob.UNSEEN_GRACE)))
        except (TypeError, ValueError) as exc:
            raise AnsibleActionFail("unseen_grace must be a number: %s" % exc) from exc

    @staticmethod
    def _forget(path):
        """Remove the job's results file (read, or of a job that will never write one)."""
        try:
            os.unlink(path)
        except OSError:
            pass
