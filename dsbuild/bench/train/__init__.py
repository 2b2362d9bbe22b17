"""``dsbuild bench CATALOG --model NAME``: a real training step on the version's batches, measured.

    from dsbuild.bench.train.options import TrainOptions
    from dsbuild.bench.train.run import run_train

    report = run_train(TrainOptions("catalog@v3", model="tiny", split="main/train", ranks=(1, 2)))

``worker`` is one rank (a process); ``launch`` starts and watches the ranks; ``profile`` and ``decompose``
turn the profiler's events into each step's parts; ``peaks`` holds the datasheet peaks and the measured
one; ``report`` the records and the figures (MFU, stragglers, scaling, verdict, cost); ``restart`` and
``checkpoint`` the restart measurement; ``history`` the run history and its regression rule; ``html``
the pages.
"""
