"""Plug-ins fed by the app's hooks: :class:`~delayq.app.ProducerHook` on the producer
side and a worker's ``on_result`` on the consumer side. Nothing below this package
imports it.

* :mod:`~delayq.observe.metrics`: Prometheus counters, histograms and store gauges.
* :mod:`~delayq.observe.otel`: OpenTelemetry traces from producer to handler.
* :mod:`~delayq.observe.logs`: JSON log lines, one per job result.
"""
