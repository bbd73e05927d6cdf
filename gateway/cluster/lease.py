"""The lease: a node acknowledges changes only while it can prove it still owns its node id.

A takeover (``serve --recover-from-tier2`` on another host) registers a
higher epoch in Tier 2 (`gateway.cluster.fence`). The old process, if it
is still running somewhere, must stop acknowledging before the new one
serves, or what it acknowledges is lost. It cannot be told (it may be cut
off from everything), so it stops by itself:

- every ``renew`` seconds it lists its node id's epochs in Tier 2; when its
  own is still the highest, its lease is *confirmed* until ``sent +
  cluster.lease``, where ``sent`` is when it sent that listing (by its own
  monotonic clock: a slow answer only shortens the lease);
- it acknowledges a change only while the lease is confirmed: both when the
  change is admitted and after it is durable, just before the answer goes
  out (`SegmentContainer`, `PendingOperation.wait`); past the lease it
  answers ``UNAVAILABLE`` ("cannot confirm ... lease") until a listing
  succeeds again. Its storage writer uploads nothing and deletes nothing
  without the lease either;
- a takeover registers its epoch first, then waits ``cluster.lease x (1 +
  LEASE_DRIFT) + LEASE_MARGIN`` (the *old* process's lease, from its epoch
  claim) before it reads Tier 2 to recover, and serves only after that.
  Every confirmation the old process can still hold was sent before the
  new epoch existed, so it ran out before the wait did.

The bound needs no synchronised clocks, only clocks that *run* at nearly
the same rate (within ``LEASE_DRIFT``; quartz clocks differ by parts per
million). A node cut off from Tier 2 stops acknowledging after at most
``cluster.lease`` -- the price of the bound. With ``cluster.lease = 0``
(or an embedded Tier 2, which no other node can reach) there is no lease:
appends go on while Tier 2 is away, and a takeover cannot bound what the
old process acknowledges.

`claim_epoch` is a start's part: refuse to run beside a live process of the
same node id, register the epoch, and wait out the previous holder's lease
when it cannot be proven gone.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import trio

from gateway.cluster.fence import (
    EpochClaim,
    EpochTaken,
    NodeFenced,
    NodeRunsElsewhere,
    fence_epochs,
    read_claim,
    register_epoch,
)
from gateway.cluster.registry import STOPPED, NodeRecord, now_ms, read_record
from gateway.errors import GatewayError, Unavailable
from gateway.storage.layer import ChunkLayer

log = logging.getLogger(__name__)

#: How much faster than ours another host's clock may run (5%: far more than
#: any working quartz clock; NTP keeps them within parts per million).
LEASE_DRIFT = 0.05
#: Added to every wait for another process's lease (scheduling, the answer's trip).
LEASE_MARGIN = 0.5


class LeaseLost(Unavailable):
    """unavailable: node {} cannot confirm in Tier 2 that it still holds epoch {} \
({}); it acknowledges no changes until it can. Retry: the change may or may not \
have been made (exactly-once writers are deduplicated)"""


class Lease:
    """This process's lease on its node id (see the module's docstring).

    ``duration`` 0 means no lease: `held` is always true (fencing is still
    noticed when Tier 2 answers).
    """

    def __init__(
        self,
        node: str,
        epoch: int,
        duration: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.epoch = epoch
        self.duration = duration
        self.clock = clock
        #: Until when (``clock``) changes may be acknowledged.
        self.valid_until = -math.inf
        #: Set once a higher epoch is seen: this process is fenced for good.
        self.fenced: NodeFenced | None = None
        #: Why the last renewal failed ("" while renewals succeed).
        self.failure = ""
        self.renewals = 0
        self.failures = 0
        #: Changes refused (or answered UNAVAILABLE after durable) for want of the lease.
        self.refused = 0
        #: `claim_epoch` with ``wait=False``: nothing may be acknowledged or
        #: stored in Tier 2 before this (``clock``); the previous holder's
        #: lease may still run until then.
        self.serve_after = -math.inf

    @property
    def enabled(self) -> bool:
        """Whether this node runs with a lease at all."""
        return self.duration > 0

    def confirm(self, sent_at: float) -> None:
        """A listing sent at ``sent_at`` showed our epoch current."""
        self.valid_until = max(self.valid_until, sent_at + self.duration)
        self.renewals += 1

    def held(self) -> bool:
        """Whether changes may be acknowledged now."""
        if self.fenced is not None:
            return False
        return not self.enabled or self.clock() < self.valid_until

    def remaining(self) -> float:
        """Seconds the lease still holds (inf without a lease, 0 once out)."""
        if not self.enabled:
            return math.inf
        return max(0.0, self.valid_until - self.clock())

    @property
    def ack_timeout(self) -> float:
        """A lease bounds nothing: durable in the local journal is durable."""
        return 0.0

    def not_acknowledged(self) -> GatewayError:
        """Never needed (`ack_timeout` is 0); for the `LeaseGate` protocol."""
        return Unavailable("not acknowledged")

    def check(self) -> None:
        """Raise unless held (NodeFenced once fenced, else LeaseLost)."""
        if self.held():
            return
        self.refused += 1
        if self.fenced is not None:
            raise self.fenced
        if self.valid_until == -math.inf:
            why = "not confirmed yet"
        else:
            why = f"last confirmed {self.clock() - self.valid_until + self.duration:.1f}s ago"
        if self.failure:
            why += f"; Tier 2: {self.failure}"
        raise LeaseLost(self.node, self.epoch, why)

    async def renew(self, layer: ChunkLayer, deadline: float) -> None:
        """One confirmation: list the node id's epochs; fenced if a higher one exists."""
        sent = self.clock()
        epochs = await fence_epochs(layer, self.node, deadline=deadline)
        current = max(epochs, default=0)
        if current > self.epoch:
            self.fenced = NodeFenced(self.node, self.epoch, current)
            return
        if current < self.epoch:
            # Our own registration is gone from the listing: not proof of
            # anything (a hand-deleted key); the epoch is not confirmed.
            raise GatewayError(f"epoch {self.epoch} of node {self.node} is not registered")
        self.confirm(sent)

    async def run(
        self,
        layer: ChunkLayer,
        interval: float,
        on_fenced: Callable[[NodeFenced], None],
    ) -> None:
        """Renew every ``interval`` until fenced (then call ``on_fenced`` once and return)."""
        deadline = max(0.5, min(interval, self.duration / 3 if self.enabled else interval))
        patience = max(5.0, self.duration)
        while True:
            try:
                # The retry policy's deadline ends retrying, not a request in
                # flight. A slow answer is waited for (the lease runs out by the
                # clock meanwhile; abandoning it would only pile requests up on
                # the layer's limiter), a hung one is given up after `patience`.
                with trio.move_on_after(patience) as scope:
                    await self.renew(layer, deadline)
                if scope.cancelled_caught:
                    raise GatewayError(f"Tier 2 did not answer within {patience:g}s")
                if self.failure:
                    log.info("cluster: lease of node %s (epoch %d) confirmed again",
                             self.node, self.epoch)  # fmt: skip
                self.failure = ""
            except GatewayError as e:
                self.failures += 1
                if not self.failure:
                    log.warning(
                        "cluster: cannot confirm the lease of node %s (epoch %d) in Tier 2: "
                        "%s; changes are refused %s unless it is confirmed again",
                        self.node,
                        self.epoch,
                        e,
                        f"in {self.remaining():.1f}s" if self.enabled else "never (no lease)",
                    )
                self.failure = str(e) or type(e).__name__
            if self.fenced is not None:
                on_fenced(self.fenced)
                return
            await trio.sleep(interval)


def renew_interval(lease: float, heartbeat_interval: float) -> float:
    """How often a lease of ``lease`` seconds is renewed: a few times per lease."""
    if lease <= 0:
        return heartbeat_interval
    return max(0.05, min(heartbeat_interval, lease / 4))


def wait_for(claim: EpochClaim | None, own_lease: float) -> float:
    """How long to wait for the process behind ``claim`` to have stopped acknowledging.

    Its own lease as it registered it; unknown (an unreadable or older
    claim): ours.
    """
    lease = own_lease if claim is None else claim.lease_ms / 1000
    if lease <= 0:
        return 0.0
    return lease * (1 + LEASE_DRIFT) + LEASE_MARGIN


async def _ensure_not_running(
    layer: ChunkLayer, node: str, record: NodeRecord, down_after: float, poll: float
) -> None:
    """Raise NodeRunsElsewhere if ``record``'s process still heartbeats.

    It is taken for gone once its heartbeat has not changed for
    ``down_after`` (by this clock; a first sight is placed by the wall clock).
    """
    age = max(0.0, (now_ms() - record.heartbeat_at_ms) / 1000)
    if age > down_after:
        return
    log.info(
        "cluster: node %s was running until %.1fs ago (epoch %d, host %s, pid %d); "
        "checking for up to %.0fs whether it still is",
        node, age, record.epoch, record.host or "?", record.pid, down_after - age,
    )  # fmt: skip
    with trio.move_on_after(down_after - age + poll):
        while True:
            await trio.sleep(poll)
            now = await read_record(layer, node)
            if now is not None and now.heartbeat_at_ms != record.heartbeat_at_ms:
                if now.state == STOPPED:
                    return
                where = (
                    f"epoch {now.epoch}, host {now.host or '?'}, pid {now.pid}, "
                    f"listening at {now.advertise}"
                )
                raise NodeRunsElsewhere(node, where)


async def claim_epoch(
    layer: ChunkLayer,
    node: str,
    epoch: int,
    journal_dir: str,
    *,
    lease: float,
    down_after: float,
    heartbeat_interval: float,
    takeover: bool = False,
    status: Callable[[str], object] = lambda text: None,
    wait: bool = True,
) -> Lease:
    """Register ``epoch`` for ``node`` safely; the lease it starts with.

    - A higher epoch registered: NodeFenced (this node was taken over).
    - ``epoch`` registered by another process: EpochTaken (a copy).
    - The previous epoch's process may still run (not on this boot with this
      journal, not stopped cleanly): unless ``takeover``, its heartbeat is
      watched for up to ``down_after`` and a live one refuses the start
      (NodeRunsElsewhere); then, after registering, its lease is waited out
      -- or, with ``wait=False``, the lease returned says until when
      (``serve_after``): the caller may fence and read meanwhile, and must
      wait before it acknowledges or stores anything.
    """
    me = EpochClaim.mine(node, epoch, journal_dir, lease if not takeover else 0.0, takeover)
    registered = await fence_epochs(layer, node)
    current = max(registered, default=0)
    if current > epoch:
        raise NodeFenced(node, epoch, current)
    if current == epoch:
        theirs = await read_claim(layer, node, epoch)
        raise EpochTaken(node, epoch, theirs.describe() if theirs else "unknown")
    wait_s = 0.0
    if current:
        previous = await read_claim(layer, node, current)
        if previous is None or not previous.gone_if_locked_by(me):
            record = await read_record(layer, node)
            stopped = record is not None and record.state == STOPPED and record.epoch >= current
            if not stopped:
                if not takeover and record is not None and record.epoch <= current:
                    status(f"checking that node {node} (epoch {record.epoch}) is not running")
                    await _ensure_not_running(
                        layer, node, record, down_after, max(0.1, heartbeat_interval / 2)
                    )
                wait_s = wait_for(previous, lease)
    sent = time.monotonic()
    await register_epoch(layer, node, epoch, me)
    registered_at = time.monotonic()
    held = Lease(node, epoch, lease)
    held.confirm(sent)
    if wait_s and not wait:
        held.serve_after = registered_at + wait_s
        log.info("cluster: epoch %d of node %s registered; epoch %d's lease runs out in %.1fs",
                 epoch, node, current, wait_s)  # fmt: skip
    elif wait_s:
        log.info(
            "cluster: epoch %d of node %s registered; waiting %.1fs for epoch %d's lease "
            "to run out before serving",
            epoch, node, wait_s, current,
        )  # fmt: skip
        status(f"waiting {wait_s:.1f}s for the previous process's lease (epoch {current})")
        await trio.sleep_until(
            trio.current_time() + max(0.0, registered_at + wait_s - time.monotonic())
        )
        await held.renew(layer, deadline=max(1.0, lease))
        if held.fenced is not None:
            raise held.fenced
    return held


__all__ = [
    "LEASE_DRIFT",
    "LEASE_MARGIN",
    "EpochTaken",
    "Lease",
    "LeaseLost",
    "NodeRunsElsewhere",
    "claim_epoch",
    "renew_interval",
    "wait_for",
]
