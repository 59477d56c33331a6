# SPDX-License-Identifier: Apache-2.0
"""A ledger of vLLM's CPU offloading manager, for the soak (test
infrastructure, loaded with the host-copy spec).

With ``"host_copy_audit_path": PATH`` in the connector's extra config the
manager records every store, eviction and load it is asked for. While the file
``PATH.request`` exists, the manager writes its accounting to PATH (JSON) each
time the scheduler registers a new request: a client that wants the state of
an idle server creates the request file and sends a request. The checks are
made in the scheduler's own thread, between two of its calls, so they see a
consistent state."""

import json
import os
from collections import Counter

from vllm.v1.kv_offload.base import LookupResult, get_offload_group_idx
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

AUDIT_PATH_KEY = "host_copy_audit_path"


class AuditedCPUOffloadingManager(CPUOffloadingManager):
    """CPUOffloadingManager that keeps a ledger of its own calls."""

    def start_audit(self, path: str) -> None:
        self.audit_path = path
        self.ledger_stored: set = set()  # completed, not evicted since
        self.ledger_pending: set = set()  # prepared, not completed
        self.ledger_loads: Counter = Counter()  # outstanding loads per key
        self.ledger_counts: Counter = Counter()
        self.ledger_stored_per_group: Counter = Counter()

    def on_new_request(self, req_context):
        if os.path.exists(self.audit_path + ".request"):
            tmp = self.audit_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.audit(), f)
            os.replace(tmp, self.audit_path)
        return super().on_new_request(req_context)

    def prepare_store(self, keys, req_context):
        out = super().prepare_store(keys, req_context)
        self.ledger_counts["prepare_store_calls"] += 1
        if out is None:
            self.ledger_counts["stores_refused"] += 1
            self.ledger_counts["keys_refused"] += len(keys)
            return out
        for key in out.evicted_keys:
            if key not in self.ledger_stored:  # pending or unknown: a defect
                self.ledger_counts["evicted_not_stored"] += 1
            self.ledger_stored.discard(key)
        self.ledger_counts["keys_evicted"] += len(out.evicted_keys)
        self.ledger_pending.update(out.keys_to_store)
        self.ledger_counts["keys_prepared"] += len(out.keys_to_store)
        return out

    def complete_store(self, keys, req_context, success: bool = True):
        super().complete_store(keys, req_context, success)
        for key in keys:
            if key not in self.ledger_pending:
                continue  # stored by an earlier job, or already completed
            self.ledger_pending.discard(key)
            if success:
                self.ledger_stored.add(key)
                self.ledger_stored_per_group[get_offload_group_idx(key)] += 1
                self.ledger_counts["keys_stored"] += 1
            else:
                self.ledger_counts["keys_store_failed"] += 1

    def prepare_load(self, keys, req_context):
        spec = super().prepare_load(keys, req_context)
        self.ledger_loads.update(keys)
        self.ledger_counts["keys_loaded"] += len(keys)
        return spec

    def complete_load(self, keys, req_context):
        super().complete_load(keys, req_context)
        self.ledger_loads.subtract(keys)

    def reset_cache(self):
        super().reset_cache()
        self.ledger_stored.clear()
        self.ledger_pending.clear()
        self.ledger_loads.clear()
        self.ledger_counts["resets"] += 1

    def audit(self) -> dict:
        """The ledger against the manager's own state."""
        unloadable = sum(
            self.lookup(key, None) != LookupResult.HIT for key in self.ledger_stored
        )
        in_use = self._num_allocated_blocks - len(self._free_list)
        return {
            "stored_keys": len(self.ledger_stored),
            "pending_store_keys": len(self.ledger_pending),
            "manager_write_pending_blocks": self._num_write_pending_blocks,
            "pending_load_keys": sum(n for n in self.ledger_loads.values() if n),
            "stored_not_loadable": unloadable,
            # Host blocks allocated but neither stored nor pending: leaked.
            "leaked_host_blocks": in_use
            - len(self.ledger_stored)
            - len(self.ledger_pending),
            "evictable_blocks": self._num_evictable_cache_blocks,
            "num_host_blocks": self._num_blocks,
            "stored_keys_per_group": {
                str(g): n for g, n in sorted(self.ledger_stored_per_group.items())
            },
            "counts": dict(self.ledger_counts),
        }


def attach_audit(manager: CPUOffloadingManager, path: str | None) -> None:
    if path is None:
        return
    manager.__class__ = AuditedCPUOffloadingManager
    manager.start_audit(path)  # type: ignore[attr-defined]
