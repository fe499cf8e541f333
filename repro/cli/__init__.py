"""The command line: `repro run | table | inspect | report | proxy | serve | build-model | tasks | images | plan`."""
