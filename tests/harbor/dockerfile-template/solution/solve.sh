#!/bin/bash
set -euo pipefail
kuka-plan "$PLAN_INPUT" > plan.txt
