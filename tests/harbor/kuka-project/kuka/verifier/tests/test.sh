#!/bin/bash
# Bundled in the kuka-verifier-v043 template. Runs in a fresh verifier root: the solver's
# template (its /opt/kuka, its kuka-plan) is absent; only the artifact /workspace/output came over.
exec python /tests/verify_kuka_submission.py
