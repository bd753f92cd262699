#!/usr/bin/env python3
"""What every Python tool shares: --version/-V (`<tool> <version> (commit <sha>)`, the version
from the repository's VERSION file) and the exit-code scheme in --help."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import fabricate as fab

TOOLS = ("downpour-summarize", "downpour-compare", "downpour-experiment", "downpour-scaling", "downpour-trace")


def first_line_of_version_file():
    with open(os.path.join(fab.ROOT, "VERSION")) as f:
        return f.readline().strip()


class Version(unittest.TestCase):
    def test_version_and_short_option_print_version_and_commit(self):
        version = first_line_of_version_file()
        for tool in TOOLS:
            for flag in ("--version", "-V"):
                with self.subTest(tool=tool, flag=flag):
                    r = fab.run_tool(tool, flag)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    self.assertRegex(r.stdout, rf"^{re.escape(tool)} {re.escape(version)} "
                                               r"\(commit ([0-9a-f]{4,}|unknown)\)\n$")

    def test_commit_is_the_checkout_head(self):
        head = subprocess.run(["git", "-C", fab.ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        if head.returncode != 0:
            self.skipTest(f"not a git checkout: {head.stderr.strip()}")
        r = fab.run_tool("downpour-summarize", "--version")
        self.assertIn(f"(commit {head.stdout.strip()})", r.stdout)

    def test_commit_unknown_outside_git(self):
        """A copy of the tools and VERSION with no .git around it: the version still prints."""
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(fab.TOOLS, os.path.join(tmp, "tools"), ignore=shutil.ignore_patterns("__pycache__"))
            shutil.copy(os.path.join(fab.ROOT, "VERSION"), tmp)
            env = dict(os.environ, GIT_CEILING_DIRECTORIES=os.path.dirname(tmp))
            r = subprocess.run([sys.executable, os.path.join(tmp, "tools", "downpour-compare"), "-V"],
                               capture_output=True, text=True, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout, f"downpour-compare {first_line_of_version_file()} (commit unknown)\n")


class Help(unittest.TestCase):
    def test_help_documents_the_exit_codes(self):
        for tool in TOOLS:
            with self.subTest(tool=tool):
                r = fab.run_tool(tool, "--help")
                self.assertEqual(r.returncode, 0)
                self.assertIn("\nexit codes:\n  0  ok\n  1  runtime failure: ", r.stdout)
                self.assertIn("\n  2  usage or config error: bad arguments", r.stdout)

    def test_short_options(self):
        for tool, options in (("downpour-compare", ("-o", "-q", "-V", "-h")),
                              ("downpour-experiment", ("-o", "-q", "-V", "-h")),
                              ("downpour-summarize", ("-q", "-V", "-h"))):
            with self.subTest(tool=tool):
                r = fab.run_tool(tool, "--help")
                for option in options:
                    self.assertRegex(r.stdout, rf"(^|\s|\[){re.escape(option)}[ ,\]]")

    def test_unknown_option_exits_2_naming_the_tool(self):
        for tool in TOOLS:
            with self.subTest(tool=tool):
                r = fab.run_tool(tool, "--no-such-option")
                self.assertEqual(r.returncode, 2)
                self.assertIn(f"{tool}: error:", r.stderr)


if __name__ == "__main__":
    unittest.main()
