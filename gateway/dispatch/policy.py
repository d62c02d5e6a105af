"""The ``dispatch`` section of a policy: how attempts on upstreams are bounded."""

from __future__ import annotations

from pydantic import Field

from gateway._model import Seconds, StrictModel


class Timeouts(StrictModel):
    """Each timeout names what it bounds; ``None`` means no bound of that kind.

    - ``connect_s``: TCP (and TLS) connect to the upstream.
    - ``first_token_s``: from sending a streamed request to its first event. A non-stream
      answer arrives whole, so only ``total_s`` bounds it.
    - ``idle_s``: the longest gap between two streamed events.
    - ``total_s``: the whole attempt, request sent to last byte received.
    """

    connect_s: Seconds | None = Field(None, gt=0)
    first_token_s: Seconds | None = Field(None, gt=0)
    idle_s: Seconds | None = Field(None, gt=0)
    total_s: Seconds | None = Field(None, gt=0)

    def over(self, base: Timeouts) -> Timeouts:
        """The timeouts this one sets (``null`` included: no bound), ``base``'s for the rest."""
        return base.model_copy(update={name: getattr(self, name) for name in self.model_fields_set})


DEFAULT_TIMEOUTS = Timeouts(connect_s=5.0, first_token_s=60.0, idle_s=60.0, total_s=600.0)
"""What applies where neither the deployment nor ``dispatch.timeouts`` says otherwise."""


class DispatchPolicy(StrictModel):
    """Gateway-wide dispatch settings; deployments may override the timeouts one by one."""

    timeouts: Timeouts = Timeouts()
