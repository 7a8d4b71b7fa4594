"""Build hook: the shipped templates/ and search_spaces/ (top-level folders of the repository) travel inside the
wheel as package data, at evoengineer/data/ (found there by evoengineer.paths._data_dir). Everything else is in
pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DATA = ("templates", "search_spaces")


class BuildPyWithData(build_py):
    def run(self):
        super().run()
        if self.editable_mode:  # an editable install reads the checkout's folders
            return
        for name in DATA:
            src = Path(__file__).resolve().parent / name
            dst = Path(self.build_lib) / "evoengineer" / "data" / name
            if dst.exists():
                shutil.rmtree(dst)
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildPyWithData})
