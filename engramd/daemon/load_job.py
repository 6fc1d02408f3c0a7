"""The load job: plan one generation's table, re-adopt a predecessor's or fill a new file, and report.

    plan ──▶ hot-row list fits? ──▶ adopt? ──yes──▶ publish the list ──▶ on_ready(generation)
                                     │no                ▲
                                     ▼                  │
    reserve ──▶ fill ──▶ verify the files unchanged ──▶ publish
    any failure (not a cancellation) ──▶ on_failed(generation)

A ``--hot-rows`` list that does not fit the table (or cannot be read or published) fails the
process's first load of its configured checkpoint, before a row is copied: an operator who
asked for a list learns at start that it is wrong.  Any other load (a reload, or a start that
resumes a reload's checkpoint) is served without the list, saying why in status and the log:
a list never takes a served table down, nor keeps a new one from being served.

Runs on the daemon's load thread, one job at a time.  It writes only its own
generation (header, path, files, progress, and error and state on failure) and
tells the daemon the outcome through the two callbacks; which generation is
served, and announcing it, is the daemon's business.  No table is visible before
it is complete: the writer publishes the file under its final name only at the end.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

from engram_client.core.errors import EngramError, TableFileError
from engram_client.core.protocol import FAILED, READY
from engram_client.core.table_file import TableHeader, read_header

from ..guards.checkpoint_files import checkpoint_root
from ..guards.checkpoint_guard import CheckpointGuard
from .config import ServeConfig
from .generation import Generation, Replica
from . import replicas as numa_replicas
from ..loading.loader import CheckpointSource, DemoSource, fill_table
from ..shm import hot_rows_file
from ..shm.numa import BoundMapping, bind_this_thread
from ..reporting.sizes import human_bytes
from ..shm.table_files import ShmDir
from ..loading.table_plan import plan_checkpoint, plan_demo

log = logging.getLogger("engramd")


def _same(found: TableHeader, wanted: TableHeader) -> bool:
    return found.fingerprint == wanted.fingerprint and found.hashing == wanted.hashing and \
        [e.layout for e in found.layers] == [e.layout for e in wanted.layers]


LOAD_WIND_DOWN_S = 2.0  # a finished load's thread gets this long to clean up before a reload is refused


class LoadJob:
    def __init__(self, generation: Generation, config: ServeConfig, shm: ShmDir, metrics, cancel: threading.Event,
                 on_ready: Callable[[Generation], None], on_failed: Callable[[Generation], None],
                 may_adopt: bool = False):
        self.generation = generation
        self.config = config
        self.shm = shm
        self.metrics = metrics
        self.cancel = cancel
        self.on_ready = on_ready
        self.on_failed = on_failed
        self.may_adopt = may_adopt  # only a process's first load looks for a predecessor's table

    def _plan(self):
        generation = self.generation
        if generation.checkpoint:
            root = checkpoint_root(generation.checkpoint, self.config.reload_roots)
            plan, header = plan_checkpoint(generation.checkpoint, root, generation.number)
            return header, lambda: CheckpointSource(plan), list(plan.files)
        seed = self.config.demo_seed
        return plan_demo(self.config.demo_vocab_size, seed, generation.number), lambda: DemoSource(seed), []

    def _adopt(self, wanted: TableHeader) -> bool:
        """Take over our predecessor's complete table if it is exactly what we would load (with
        --numa-replicas: its replicas that are, rebuilding the others from one of them)."""
        generation = self.generation
        adopted = None
        nodes = self.config.replica_nodes
        tables = self.shm.own_tables()
        for number, path in tables:
            if adopted is not None:
                break
            try:
                found, _ = read_header(path)
            except TableFileError as exc:
                log.warning("not re-adopting %s: %s", path, exc)
                continue
            first = path == self.shm.table_path(number)
            if _same(found, wanted) and (first or nodes):  # a further replica serves only as a replica
                adopted = (number, path, found)
        keep = set()
        if adopted is not None:
            keep = {adopted[1]} if not nodes else \
                {self.shm.table_path(adopted[0], None if i == 0 else node) for i, node in enumerate(nodes)}
        for number, path in tables:
            if path not in keep:
                self.shm.unlink(path)
                log.info("removed %s: a predecessor's table that is not the one to serve", path)
        if adopted is None:
            return False
        number, path, found = adopted
        if nodes:
            good = numa_replicas.adopt(self.shm, number, found, nodes, _same)
            if not good:
                return False
            self._rebuild(number, found, good)
            path = generation.replicas[0].path
        generation.number, generation.path, generation.header, generation.adopted = number, path, found, True
        generation.progress.total_bytes = generation.progress.done_bytes = sum(e.nbytes for e in found.layers)
        self.metrics.readoptions.inc()
        log.info("re-adopted %s (generation %d) without reloading", path, number)
        return True

    def _hot_list_failed(self, exc: EngramError) -> None:
        """A list that does not fit: the first load of --checkpoint fails, any other goes on without it."""
        generation = self.generation
        if not generation.by_reload and generation.checkpoint == self.config.checkpoint:
            generation.hot_rows_error = f"the hot-row list failed the load: {exc}"  # status names it as the cause
            raise exc
        generation.hot_rows, generation.hot_rows_error = None, f"served without the hot-row list: {exc}"
        log.warning("generation %d is %s", generation.number, generation.hot_rows_error)

    def _hot_list(self, header: TableHeader):
        if self.config.hot_rows is None:
            return None
        try:
            return hot_rows_file.fitting_list(self.config.hot_rows, [e.layout for e in header.layers],
                                              header.fingerprint)
        except EngramError as exc:
            self._hot_list_failed(exc)
            return None

    def _publish_hot_list(self, hot) -> None:
        """The list's copy beside the table file, before the generation is served."""
        if hot is None:
            return
        shm, generation = self.shm, self.generation
        try:
            generation.hot_rows = hot_rows_file.publish(hot, self.config.hot_rows, generation.path,
                                                        shm.file_mode, shm.gid)
        except EngramError as exc:
            try:
                self._hot_list_failed(exc)
            except EngramError:
                if generation.path is not None and not generation.adopted:
                    shm.unlink(generation.path)  # a first load that fails here leaves no table behind
                    generation.path = None
                raise

    def _rebuild(self, number: int, header: TableHeader, good: dict[int, str]) -> None:
        """The adopted set, with the replicas that were missing or broken copied from a good one."""
        nodes = self.config.replica_nodes
        missing = [node for node in nodes if node not in good]
        if missing:
            self.shm.check_space(header.total_bytes, len(missing))
            source = good[next(iter(good))]
            fd = os.open(source, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                mapping = BoundMapping(fd, header.total_bytes, numa_replicas.bind_node(next(iter(good))), source)
            finally:
                os.close(fd)
            try:
                for node in missing:  # the first replica's name is reserved by shm.table_path(number)
                    writer = numa_replicas.reserve(self.shm, header, node, first=node == nodes[0])
                    try:
                        numa_replicas.copy_into(writer, mapping.address, node, self.config.load_threads, self.cancel,
                                                self.config.max_load_rate, self.metrics.load_bytes.inc)
                        numa_replicas.check_placement(writer.bound, node, writer.final_path)
                        good[node] = writer.publish()
                    except BaseException:
                        writer.abandon()
                        raise
                    log.info("re-adoption: rebuilt the replica for NUMA node %d (%s) from %s", node, good[node], source)
            finally:
                mapping.close()
        self.generation.replicas = [Replica(node, good[node]) for node in nodes]

    def run(self) -> None:
        generation = self.generation
        writer = source = None
        copies: list = []
        nodes = self.config.replica_nodes
        try:
            header, make_source, files = self._plan()
            generation.files = files
            guard = CheckpointGuard(files)  # before the first row is read
            hot = self._hot_list(header)
            if self.may_adopt and self._adopt(header):
                self._publish_hot_list(hot)
                self.on_ready(generation)
                return
            generation.header = header
            generation.progress.total_bytes = sum(entry.nbytes for entry in header.layers)
            if self.config.numa_node is not None:
                bind_this_thread(self.config.numa_node)  # fallocate below places every page on that node
            source = make_source()
            generation.progress.on_add = self.metrics.load_bytes.inc
            if nodes:  # every replica's room first, then the first replica, bound to its node
                self.shm.check_space(header.total_bytes, len(nodes))
                writer = numa_replicas.reserve(self.shm, header, nodes[0], first=True)
            else:
                writer = self.shm.create(header)
            log.info("loading generation %d from %s into %s (%s)", generation.number, header.checkpoint,
                     writer.partial_path, human_bytes(header.total_bytes))
            started = time.monotonic()
            fill_table(writer, source, generation.progress, self.config.load_threads, self.cancel,
                       self.config.max_load_rate)
            if self.cancel.is_set():
                raise EngramError("load cancelled by stop")
            guard.verify(source, header, writer.read)
            if nodes:
                numa_replicas.check_placement(writer.bound, nodes[0], writer.final_path)
                copies = numa_replicas.build_copies(self.shm, header, writer, nodes[1:], self.config.load_threads,
                                                    self.cancel, self.config.max_load_rate, self.metrics.load_bytes.inc)
                generation.replicas = numa_replicas.publish([(nodes[0], writer), *zip(nodes[1:], copies)])
                generation.path = generation.replicas[0].path
            else:
                generation.path = writer.publish()
            writer, copies = None, []
            self._publish_hot_list(hot)
            elapsed = time.monotonic() - started
            log.info("generation %d ready: %s, %s in %.2f s (%.2f GB/s%s)", generation.number, generation.path,
                     human_bytes(header.total_bytes), elapsed,
                     generation.progress.done_bytes / max(elapsed, 1e-9) / 1e9,
                     f"; {len(nodes)} NUMA replicas: {numa_replicas.describe(nodes)}" if nodes else "")
            self.on_ready(generation)
        except Exception as exc:  # any failure becomes that generation's 'failed', with its reason
            generation.error = str(exc) if isinstance(exc, EngramError) else f"{type(exc).__name__}: {exc}"
            generation.state = FAILED
            if not self.cancel.is_set():
                log.error("generation %d failed to load: %s", generation.number, generation.error)
                self.on_failed(generation)
        finally:
            for unfinished in [writer, *copies] if writer is not None else copies:
                unfinished.abandon()
            if source is not None:
                source.close()


class LoadThread(threading.Thread):
    """The thread that runs one LoadJob, and whether a new load must wait for it."""

    def __init__(self, job: LoadJob):
        super().__init__(target=job.run, name=f"engramd-load-g{job.generation.number}", daemon=True)
        self.generation = job.generation

    def busy(self) -> bool:
        """Whether it still runs.  Once its generation has ended (status says ready or failed) it only
        cleans up (a half-written file removed, the source closed): a client that read that end and
        reloads at once waits up to LOAD_WIND_DOWN_S for it rather than being refused as in progress."""
        if self.is_alive() and self.generation.state in (READY, FAILED):
            self.join(timeout=LOAD_WIND_DOWN_S)
        return self.is_alive()
