"""Commands and pytest runs under resource limits: a clean environment, rlimits, a hard timeout, the whole session
killed after (``limits``); pytest node ids run and their statuses parsed (``pytest_runner``), forked from a warm
pytest server (``pytest_server``, its program ``pytest_zygote_main``). Used by the sandbox's grading and by task
generation's mutant validation; imports neither."""
