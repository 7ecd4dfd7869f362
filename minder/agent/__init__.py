"""The node agent (``minder agent``): its assembly from the options and its run loop.

- :mod:`minder.agent.assembly` builds the node's agent from the options (identity, sources,
  flight-recorder watcher, signing key) and runs it: :func:`~minder.agent.assembly.collect_once`
  (``--once``) or :func:`~minder.agent.assembly.run_agent` (spool, Kafka sender, ``/metrics``);
- :mod:`minder.agent.runner` is the run loop: the collector and sender threads around the
  on-disk spool, and the goodbye of a clean stop.

What is collected lives in :mod:`collectors` (:class:`collectors.agent.Agent` and its sources),
how batches travel in :mod:`minder.stream` (the spool, the Kafka sender). ``minder/cli/agent.py``
only parses the options, calls one of the two functions and prints. Nothing is imported here, so
that ``minder agent --help`` stays light.
"""
