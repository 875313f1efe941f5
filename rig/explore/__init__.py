"""``pdrig explore``: seeded, stateful exploration of a live P/D deployment (grammar, generator,
oracles through the one verdict engine, behaviour coverage, history, replay, shrinking, emitted
scenario YAML). The app layer, beside rig/run: it drives :class:`rig.run.runner.SuiteRunner`."""
