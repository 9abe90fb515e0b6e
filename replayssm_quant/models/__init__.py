from .fixture import FIXTURES, fixture, fixture_path

__all__ = ["FIXTURES", "fixture", "fixture_path"]
