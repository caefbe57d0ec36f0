"""Patch a COPY of the tree with hop marks (``pprobe.mark``) along a collective's path, sandbox and
replayer side, to see where an emulated 2-rank all-reduce spends its time (session 43):

    issue <op> g<gid>   the script's thread enters the backend     (prism/sandbox/backend.py)
    on_issue done, submitted, wait                                   (the recorder, the engine, the script's wait)
    put, got            the op handed to the group's channel thread  (prism/sandbox/engines/live.py)
    exec <op>, complete the channel thread runs the op / completes its future
    checked             its recorded data loaded and its input compared with it
    S start, S recv tN  the sandbox party's lockstep driver           (prism/nccl_patches/pruned.py)
    V released          the replayer's clock released the vrank       (prism/vrank_replayer/replayer.py)
    V start, V posted, V recv tN, V sent after tN, V sends done, V done   the vrank party's driver

    cp -r TREE /tmp/probed && python bench/_debug/hop_probe/apply.py /tmp/probed
    PRISM_PAIR_PROBE=DIR PYTHONPATH=/tmp/probed prism emulate run ...   # then hops.py DIR
"""
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
IMPORT = "from prism.pprobe import mark; "
PATCHES = [
    ("prism/sandbox/backend.py", "    def _issue(self, request: CommRequest) -> PrismWork:\n        ctx = self._context\n",
     "    def _issue(self, request: CommRequest) -> PrismWork:\n        " + IMPORT
     + "mark(f'issue {request.op.value} g{self.handle.group_id}')\n        ctx = self._context\n"),
    ("prism/sandbox/backend.py", "        token = ctx.observer.on_issue(request)\n",
     "        token = ctx.observer.on_issue(request)\n        mark('on_issue done')\n"),
    ("prism/sandbox/backend.py", "            future = ctx.engine.submit(request)\n",
     "            future = ctx.engine.submit(request)\n            mark('submitted')\n"),
    ("prism/sandbox/backend.py", "    def wait(self, timeout=None) -> bool:  # noqa: ARG002 - c10d passes a timedelta\n",
     "    def wait(self, timeout=None) -> bool:  # noqa: ARG002 - c10d passes a timedelta\n        " + IMPORT + "mark('wait')\n"),
    ("prism/sandbox/engines/live.py", "    def _execute(self, req: CommRequest, snapshot, early: _Early | None = None) -> None:\n",
     "    def _execute(self, req: CommRequest, snapshot, early: _Early | None = None) -> None:\n        " + IMPORT + "mark(f'exec {req.op.value}')\n"),
    ("prism/sandbox/engines/live.py",
     "    def _complete(self, future: torch.futures.Future, outputs: list[torch.Tensor], extra: dict) -> None:\n",
     "    def _complete(self, future: torch.futures.Future, outputs: list[torch.Tensor], extra: dict) -> None:\n        "
     + IMPORT + "mark('complete')\n"),
    ("prism/sandbox/engines/live.py", "            ch.queue.put((self._run, request, future, snapshot, ch, early))\n",
     "            " + IMPORT + "mark('put')\n            ch.queue.put((self._run, request, future, snapshot, ch, early))\n"),
    ("prism/sandbox/engines/live.py", "        while (item := self.queue.get()) is not None:\n",
     "        from prism.pprobe import mark\n        while (item := self.queue.get()) is not None:\n            mark('got')\n"),
    ("prism/sandbox/engines/live.py",
     "        is_p2p = req.op in (CommOp.SEND, CommOp.RECV)\n        tag_base = p2p_tag_base(",
     "        " + IMPORT + "mark('checked')\n        is_p2p = req.op in (CommOp.SEND, CommOp.RECV)\n        tag_base = p2p_tag_base("),
    ("prism/nccl_patches/pruned.py", "    groups = [steps for _, steps in _by_step(party.steps)]\n",
     "    groups = [steps for _, steps in _by_step(party.steps)]\n    " + IMPORT + "mark('S start')\n"),
    ("prism/nccl_patches/pruned.py",
     "                    raise PrismError(f\"pruned collective: step {st} timed out after {timeout_s}s\")\n                party.incoming(st, buf)\n            for work in sends:",
     "                    raise PrismError(f\"pruned collective: step {st} timed out after {timeout_s}s\")\n"
     "                mark(f'S recv t{st.t}')\n                party.incoming(st, buf)\n            for work in sends:"),
    ("prism/nccl_patches/pruned.py", "    ahead = _PostedAhead(party, transport, n, tag_base, _MAX_BYTES_POSTED_AHEAD)\n",
     "    " + IMPORT + "mark('V start')\n    ahead = _PostedAhead(party, transport, n, tag_base, _MAX_BYTES_POSTED_AHEAD)\n"),
    ("prism/nccl_patches/pruned.py", "    ahead.post()\n\n    def finish()", "    ahead.post()\n    mark('V posted')\n\n    def finish()"),
    ("prism/nccl_patches/pruned.py", "            party.incoming(st, buf)\n            sends.extend(",
     "            mark(f'V recv t{st.t}')\n            party.incoming(st, buf)\n            sends.extend("),
    ("prism/nccl_patches/pruned.py", "            ahead.post()\n        for work in sends:\n            work.wait(timeout)\n",
     "            ahead.post()\n            mark(f'V sent after t{st.t}')\n        for work in sends:\n            work.wait(timeout)\n"
     "        mark('V sends done')\n"),
    ("prism/vrank_replayer/replayer.py", "            finish = start_party(",
     "            " + IMPORT + "mark('V released')\n            finish = start_party("),
    ("prism/vrank_replayer/replayer.py", "        self.clock.collective_done(node)\n",
     "        self.clock.collective_done(node)\n        " + IMPORT + "mark('V done')\n"),
]


def main() -> None:
    tree = Path(sys.argv[1])
    if (tree / ".git").exists():
        sys.exit(f"{tree}: a checkout; patch a copy")
    for rel, old, new in PATCHES:
        path = tree / rel
        text = path.read_text()
        if text.count(old) != 1:
            sys.exit(f"{rel}: the anchor for {new.strip().splitlines()[-1]!r} is not there once; update apply.py")
        path.write_text(text.replace(old, new))
    shutil.copy(HERE / "pprobe.py", tree / "prism" / "pprobe.py")
    print(f"{tree}: {len(PATCHES)} marks")


if __name__ == "__main__":
    main()
