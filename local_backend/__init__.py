"""Model servers on this machine, for Switchyard to route to.

- :mod:`local_backend.sim`: the OpenAI-compatible simulator (the upstream of the tests
  and benchmarks);
- :mod:`local_backend.vllm`: launching and supervising ``vllm serve``.

Both import the gateway's shared helpers; the gateway imports neither, except where it
starts them (its runner and CLI). :class:`LoopThread` is what both use to run a service
on its own event loop for a synchronous owner.
"""

from local_backend._loop_thread import LoopThread

__all__ = ["LoopThread"]
