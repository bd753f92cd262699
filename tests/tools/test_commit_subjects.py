#!/usr/bin/env python3
"""Commit subjects are a table of contents (CONTRIBUTING.md "Commits"): every commit after the
project's last long subject has a subject of at most 72 characters. Skips outside a git checkout
and in a shallow clone that lacks that commit."""
import subprocess
import unittest

import fabricate as fab

# The last commit whose subject was an essay; history before it is left as it landed.
LAST_LONG_SUBJECT = "504379d9788c8393557ba2c3cf6059fdf27108aa"
MAX_SUBJECT = 72


def git(*args):
    return subprocess.run(["git", "-C", fab.ROOT, *args], capture_output=True, text=True)


class CommitSubjects(unittest.TestCase):
    def test_subjects_after_the_last_long_one_fit_72_characters(self):
        if git("rev-parse", "--git-dir").returncode != 0:
            self.skipTest("not a git checkout")
        if git("cat-file", "-e", LAST_LONG_SUBJECT + "^{commit}").returncode != 0:
            self.skipTest(f"commit {LAST_LONG_SUBJECT[:12]} is not in this clone (shallow?)")
        r = git("log", "--format=%h %s", f"{LAST_LONG_SUBJECT}..HEAD")
        self.assertEqual(r.returncode, 0, r.stderr)
        long = [line for line in r.stdout.splitlines() if len(line.split(" ", 1)[1]) > MAX_SUBJECT]
        self.assertEqual(long, [], f"subjects over {MAX_SUBJECT} characters (put the why in the body: "
                                   "git commit -m subject -m body)")


if __name__ == "__main__":
    unittest.main()
