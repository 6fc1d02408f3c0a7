"""The daemon's settings: one dataclass, validated where it is built."""
from __future__ import annotations

import grp
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engram_client.core.budget_file import DECODE_SPARES, PREFILL_GATHERS
from engram_client.core.demo_rows import DEMO_VOCAB_SIZE
from engram_client.core.endpoints import default_endpoint, pub_endpoint_for
from engram_client.core.errors import ConfigError

if TYPE_CHECKING:
    from .gather_budget import BudgetGroup


@dataclass
class ServeConfig:
    checkpoint: str | None = None
    endpoint: str = ""
    events_endpoint: str = ""
    shm_dir: str = "/dev/shm"
    load_threads: int = 4
    lease_seconds: float = 10.0
    demo_vocab_size: int = DEMO_VOCAB_SIZE
    demo_seed: int = 0
    progress_bar: bool = False
    max_load_rate: float | None = None  # bytes per second; None loads as fast as the machine allows
    reload_roots: list[str] = field(default_factory=list)  # where `reload` may read checkpoints from
    retire_grace_seconds: float = 600.0  # a retired generation's file goes after this even if still held
    group: str | None = None  # a group that may use the socket and read the table, besides the owner
    remote_status: str | None = None  # a tcp:// endpoint answering status only, with CURVE
    curve_keys_dir: str | None = None
    metrics_port: int | None = None
    metrics_address: str = "127.0.0.1"
    numa_node: int | None = None
    numa_replicas: str | None = None  # "all" or a node list: one table copy per node (daemon/replicas.py)
    gather_cpus: str | None = None  # the node's gather budget: a CPU list, "N%", "off"; None: the default share
    prefill_gathers: str = "normal"  # "idle": ranks gather prefill-size calls at SCHED_IDLE (lookup/host/engine/crew.c)
    decode_cpus: str = "auto"  # CPUs per budget group kept from prefill gathers (daemon/decode_cpus.py)
    decode_spares: str = "quiet"  # "idle": spares gather beside decodes too; "off": no spares on the decode CPUs
    hot_rows: str | None = None  # a hot-row list to publish with each generation (hot_rows_file.py)
    gid: int | None = field(default=None, init=False)  # resolved from ``group``
    replica_nodes: list[int] = field(default_factory=list, init=False)  # from ``numa_replicas``; [] without
    budget_groups: list["BudgetGroup"] = field(default_factory=list, init=False)  # from ``gather_cpus``; [] for off

    def __post_init__(self) -> None:
        self.endpoint = self.endpoint or default_endpoint()
        if not self.endpoint.startswith("ipc://"):
            # Unauthenticated TCP would let anyone on the network stop the daemon; inproc:// is
            # reachable only from inside the daemon's own process.
            why = {"tcp://": "TCP endpoints are refused (status alone is served over TCP, with CURVE: --remote-status)",
                   "inproc://": "inproc:// reaches only the daemon's own process"}
            reason = next((text for scheme, text in why.items() if self.endpoint.startswith(scheme)), None)
            raise ConfigError(f"--socket {self.endpoint!r}: engramd serves requests only on an ipc:// endpoint "
                              f"(a Unix socket path, e.g. ipc:///run/engramd/engramd.sock)"
                              + (f"; {reason}" if reason else ""))
        if self.metrics_port is not None and not 1 <= self.metrics_port <= 65535:
            raise ConfigError(f"--metrics-port must be 1..65535, got {self.metrics_port}")
        if self.numa_node is not None:
            from ..shm.numa import check_node
            check_node(self.numa_node)
        if self.numa_replicas is not None:
            if self.numa_node is not None:
                raise ConfigError("--numa-node and --numa-replicas both place the table's pages: give one")
            from .replicas import plan_nodes
            self.replica_nodes = plan_nodes(self.numa_replicas)
        from .gather_budget import check_spec, plan_groups
        check_spec(self.gather_cpus)
        self.budget_groups = plan_groups(self.gather_cpus)  # its CPUs checked here, so --print-config refuses them too
        if self.prefill_gathers not in PREFILL_GATHERS:
            raise ConfigError(f"--prefill-gathers must be one of {', '.join(PREFILL_GATHERS)}, got {self.prefill_gathers!r}")
        if self.prefill_gathers != "normal" and self.gather_cpus == "off":
            raise ConfigError(f"--prefill-gathers {self.prefill_gathers} is a rule of the node's gather budget, and "
                              "--gather-cpus off has none")
        from .decode_cpus import AUTO, check_spec as check_decode_spec
        check_decode_spec(self.decode_cpus)
        if self.decode_spares not in DECODE_SPARES:
            raise ConfigError(f"--decode-spares must be one of {', '.join(DECODE_SPARES)}, got {self.decode_spares!r}")
        if self.decode_cpus not in (AUTO, "0") and self.prefill_gathers == "idle":
            raise ConfigError(f"--decode-cpus {self.decode_cpus} with --prefill-gathers idle: the idle crew already "
                              "leaves every CPU to decode calls; give one of them")
        if self.decode_cpus not in (AUTO, "0") and self.gather_cpus == "off":
            raise ConfigError(f"--decode-cpus {self.decode_cpus} is a rule of the node's gather budget, and "
                              "--gather-cpus off has none")
        if self.decode_cpus not in (AUTO, "0"):  # a count every group can give, checked before anything starts
            from .decode_cpus import decode_counts
            from .gather_budget import plan_groups
            decode_counts([len(g.cpus) for g in plan_groups(self.gather_cpus)], self.decode_cpus, self.prefill_gathers)
        if self.remote_status and not self.curve_keys_dir:
            raise ConfigError(f"--remote-status {self.remote_status}: TCP is served only with CURVE authentication; "
                              "give --curve-keys-dir (create one with `engramd keys DIR`)")
        if self.group is not None:
            if self.group.isdigit():  # a numeric gid works even where /etc/group does not list it
                self.gid = int(self.group)
            else:
                try:
                    self.gid = grp.getgrnam(self.group).gr_gid
                except KeyError as exc:
                    raise ConfigError(f"--group {self.group}: no such group") from exc
            from ..guards.safe_paths import check_group_usable
            check_group_usable(self.group, self.gid)  # before anything is bound or created
        self.events_endpoint = self.events_endpoint or pub_endpoint_for(self.endpoint)
        if not self.events_endpoint.startswith("ipc://"):
            raise ConfigError(f"--events-socket {self.events_endpoint!r}: only ipc:// endpoints are served")
        if self.checkpoint is not None and not self.checkpoint.strip():
            # An unset variable in a unit's command line; abspath("") would quietly be the cwd.
            raise ConfigError("--checkpoint is empty; give a checkpoint directory, or none for the demo table")
        if self.checkpoint is not None:
            self.checkpoint = os.path.abspath(self.checkpoint)
            if not os.path.isdir(self.checkpoint):
                raise ConfigError(f"--checkpoint {self.checkpoint}: no such directory")
        if self.checkpoint is not None and not self.reload_roots:
            self.reload_roots = [os.path.dirname(self.checkpoint)]
        self.reload_roots = [os.path.abspath(root) for root in self.reload_roots]
        if self.retire_grace_seconds < 0:
            raise ConfigError(f"--retire-grace-seconds must be >= 0, got {self.retire_grace_seconds}")
        self.shm_dir = os.path.abspath(self.shm_dir)
        if not os.path.isdir(self.shm_dir):
            raise ConfigError(f"--shm-dir {self.shm_dir}: no such directory")
        if not 1 <= self.load_threads <= 256:
            raise ConfigError(f"--load-threads must be 1..256, got {self.load_threads}")
        if not 0.5 <= self.lease_seconds <= 3600:
            raise ConfigError(f"--lease-seconds must be 0.5..3600, got {self.lease_seconds}")
        if self.max_load_rate is not None and self.max_load_rate <= 0:
            # Given in MB/s on the command line and in settings; said back the same way.
            raise ConfigError(f"--max-load-rate must be positive, got {self.max_load_rate / 1e6:g} MB/s")
        if self.hot_rows is not None:  # read now, so a damaged list stops `serve` at once; each load reads it again
            from engram_client.core.errors import HotListError
            from engram_client.core.hot_list import read_hot_list
            self.hot_rows = os.path.abspath(self.hot_rows)
            try:
                read_hot_list(os.path.realpath(self.hot_rows))
            except HotListError as exc:
                raise ConfigError(f"--hot-rows: {exc}") from exc
        if self.demo_vocab_size < 1:
            raise ConfigError(f"--demo-vocab-size must be positive, got {self.demo_vocab_size}")
