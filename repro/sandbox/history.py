"""The agent's git history: a shell script that leaves a container's repository with one root commit of its tree.

A task image's repository can hand the agent the fix through git: a SWE-smith instance branch's head ("Remove F2P
Tests") has the "Bug Patch" commit as parent (``git show HEAD~1`` is the reverse of the fix); SWE-bench images may
carry later commits, tags, branches, reflogs or unreachable objects. :func:`scrub_command` runs inside the
container's repository before the agent starts (after the SWE-smith ``git checkout``) and leaves what the local
sandbox's agent copies have (:func:`repro.sandbox.repos.make_agent_copy`): the current ``HEAD`` tree under ONE new
root commit (fixed author, date and message, so its sha is the same for every rollout of a task and equals the
local copy's), ``HEAD`` on ``branch`` (or detached where it was), the same commit under :data:`BASE_REF` (what the
rollout's patch is taken against), and nothing else: no other refs (branches, tags, remotes, stash, notes,
``refs/original``), no reflog, no remotes in the config, no alternates, no shallow file, no leftover state files
(``ORIG_HEAD``, ``FETCH_HEAD``, rebase/sequencer dirs, ``rr-cache``, ``lost-found``, ``branches/``), and an object
store holding only that commit's objects (packed afresh; the old store is deleted, so no unreachable object
survives). Not covered: submodules' own repositories (``.git/modules``) and files in the working tree itself.

The working tree is left as it was; the index is reset to the new commit (same tree, stat data kept).
"""

from __future__ import annotations

import shlex

BASE_REF = "refs/repro/base"
ROOT_AUTHOR = ("repro", "repro@localhost")  # as repro.sandbox.repos.GIT_ENV, so local and docker shas agree
ROOT_DATE = "2000-01-01T00:00:00Z"
ROOT_MESSAGE = "base"
SCRUB_FAILED = "repro: scrubbing the repository's git history failed"
# Files and folders of a git directory that hold history or past state, removed outright.
_STATE = ("packed-refs", "logs", "ORIG_HEAD", "FETCH_HEAD", "MERGE_HEAD", "MERGE_MSG", "CHERRY_PICK_HEAD",
          "REVERT_HEAD", "BISECT_LOG", "BISECT_START", "BISECT_TERMS", "BISECT_EXPECTED_REV", "AUTO_MERGE",
          "COMMIT_EDITMSG", "SQUASH_MSG", "shallow", "rebase-merge", "rebase-apply", "sequencer", "rr-cache",
          "lost-found", "worktrees", "branches", "gitk.cache", "info/refs", "info/grafts", "refs",
          "objects.repro-old", "objects.repro-new")


def scrub_command(branch: str | None = None) -> str:
    """A ``bash`` script, run in the repository's working tree, replacing its history by one root commit of
    ``HEAD``'s tree. ``branch``: the branch ``HEAD`` is left on (``None``: the branch it is on, or detached where
    it is detached). Prints the new commit's sha last; on failure exits non-zero with :data:`SCRUB_FAILED` and the
    step that failed."""
    attach = f"branch={shlex.quote(branch)}" if branch else \
        'branch=$(git symbolic-ref -q --short HEAD || true)'
    state = " ".join(shlex.quote(p) for p in _STATE)
    env = (f"GIT_AUTHOR_NAME={ROOT_AUTHOR[0]} GIT_AUTHOR_EMAIL={ROOT_AUTHOR[1]} GIT_AUTHOR_DATE={ROOT_DATE} "
           f"GIT_COMMITTER_NAME={ROOT_AUTHOR[0]} GIT_COMMITTER_EMAIL={ROOT_AUTHOR[1]} GIT_COMMITTER_DATE={ROOT_DATE}")
    return "\n".join([
        "set -u",
        f'fail() {{ echo "{SCRUB_FAILED} in $PWD: $1 (set sandbox.scrub_history=false to keep the image\'s '
        'history)" >&2; exit 1; }',
        "git rev-parse --is-inside-work-tree >/dev/null 2>&1 || fail 'not a git working tree'",
        'gd=$(git rev-parse --absolute-git-dir) || fail "no git directory"',
        "tree=$(git rev-parse --verify -q 'HEAD^{tree}') || fail 'HEAD names no commit'",
        attach,
        f"root=$(env {env} git -c commit.gpgsign=false commit-tree \"$tree\" -m {ROOT_MESSAGE} </dev/null) "
        "|| fail 'git commit-tree'",
        'rm -rf "$gd/objects.repro-new" && mkdir -p "$gd/objects.repro-new/pack" "$gd/objects.repro-new/info" '
        "|| fail 'making the new object store'",
        'echo "$root" | git pack-objects --revs --window=0 -q "$gd/objects.repro-new/pack/pack" >/dev/null '
        "|| fail 'git pack-objects'",
        'mv "$gd/objects" "$gd/objects.repro-old" && mv "$gd/objects.repro-new" "$gd/objects" '
        "|| fail 'swapping in the new object store'",
        f'(cd "$gd" && rm -rf {state}) || fail "removing refs and history files"',
        'mkdir -p "$gd/refs/heads" "$gd/refs/tags" || fail "recreating refs/"',
        "for section in $(git config --name-only --get-regexp '^(remote|branch)\\.' 2>/dev/null "
        "| sed 's/\\.[^.]*$//' | sort -u); do git config --remove-section \"$section\" 2>/dev/null; done",
        "git config --unset-all core.alternateRefsCommand 2>/dev/null; true",
        'if [ -n "$branch" ]; then git update-ref --no-deref "refs/heads/$branch" "$root" && '
        'git symbolic-ref HEAD "refs/heads/$branch" || fail "pointing HEAD at $branch"; '
        'else git update-ref --no-deref HEAD "$root" || fail "detaching HEAD"; fi',
        f'git update-ref {BASE_REF} "$root" || fail "writing {BASE_REF}"',
        "git reset -q 2>/dev/null || git read-tree HEAD || fail 'resetting the index'",
        'rm -rf "$gd/logs" "$gd/ORIG_HEAD" || fail "removing the reflog"',
        "[ \"$(git rev-list --all | wc -l)\" = 1 ] || fail 'more than one commit left'",
        'echo "$root"',
    ])
