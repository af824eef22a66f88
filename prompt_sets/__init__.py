"""The prompt sets bundled with specexec (Spec-Bench, DeepJSONEval extraction, JSONSchemaBench, BFCL,
HumanEval; sources and licences in `data/README.md`), read by `specexec bench` and by EAGLE-3 training."""
