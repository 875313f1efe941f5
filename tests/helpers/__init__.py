"""Helpers shared by the test modules, imported as a package (``from tests.helpers.fake_rig import
fake_config``): rig configs of fake servers, survivor checks, fake-server suites, and the
observations, records and metrics the unit tests of one layer build for another's."""
