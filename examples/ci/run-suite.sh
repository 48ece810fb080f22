#!/usr/bin/env bash
# Every shell step of the CI templates (github-actions.yml, gitlab-ci.yml), in one file, so
# that what a CI job runs is exactly what tests/test_ci_templates.py runs.
#
#   run-suite.sh fetch-target    download the target branch's scorecard.json, when it has one
#   run-suite.sh run [ARGS...]   run the suite (ARGS go to `tightrope run`, e.g. -k nan-grad),
#                                write the job summary, compare with the target's scorecard
#
# Settings, from the environment:
#   TIGHTROPE             the tightrope command    (default: .venv/bin/tightrope, else tightrope)
#   TIGHTROPE_SUITE       the suite file           (default: scenarios/smoke.yaml)
#   TIGHTROPE_OUT         where the scorecards go  (default: out/scorecard)
#   TIGHTROPE_MIN_SCORE   fail below this score    (default: 90)
#   TIGHTROPE_TARGET      the target branch's scorecard directory (default: out/target-scorecard)
#   TIGHTROPE_TARGET_BRANCH  the branch fetch-target takes it from (none: nothing is fetched)
#   TIGHTROPE_ARTIFACT    the artifact that holds it on GitHub (default: tightrope-scorecard)
#   TIGHTROPE_WORKFLOW    the workflow that uploads it on GitHub (default: $GITHUB_WORKFLOW)
#   GITHUB_STEP_SUMMARY   set by GitHub Actions; without it the summary goes to stdout
#
# `run` exits with `tightrope run`'s status (0: every scenario passed and the score met
# TIGHTROPE_MIN_SCORE; 1: not; 2: invalid input; 130: interrupted), and 1 as well when
# `tightrope compare` finds a regression against the target branch's scorecard.
# `fetch-target` never fails the job: a first run on a branch has nothing to compare with.
set -euo pipefail

if [[ -z ${TIGHTROPE:-} ]]; then
    if [[ -x .venv/bin/tightrope ]]; then TIGHTROPE=.venv/bin/tightrope; else TIGHTROPE=tightrope; fi
fi
SUITE=${TIGHTROPE_SUITE:-scenarios/smoke.yaml}
OUT=${TIGHTROPE_OUT:-out/scorecard}
MIN_SCORE=${TIGHTROPE_MIN_SCORE:-90}
TARGET=${TIGHTROPE_TARGET:-out/target-scorecard}
ARTIFACT=${TIGHTROPE_ARTIFACT:-tightrope-scorecard}

# A message the CI shows beside the job (GitHub annotations); elsewhere a plain line.
annotate() { # LEVEL MESSAGE
    if [[ ${GITHUB_ACTIONS:-} == true ]]; then
        echo "::$1 title=tightrope::$2"
    else
        echo "tightrope: $1: $2"
    fi
}

# Markdown for the job summary: appended to $GITHUB_STEP_SUMMARY, or printed.
summary() {
    if [[ -n ${GITHUB_STEP_SUMMARY:-} ]]; then cat >>"$GITHUB_STEP_SUMMARY"; else cat; fi
}

fetch_target() {
    local branch=${TIGHTROPE_TARGET_BRANCH:-}
    if [[ -z $branch ]]; then
        echo "tightrope: no TIGHTROPE_TARGET_BRANCH; nothing to compare with"
        return 0
    fi
    mkdir -p "$TARGET"
    if [[ ${GITHUB_ACTIONS:-} == true ]]; then
        # The newest finished run of this workflow on the target branch; its artifact is
        # uploaded whatever the run's outcome, so a failing target still compares.
        local workflow=${TIGHTROPE_WORKFLOW:-${GITHUB_WORKFLOW:-}} id
        id=$(gh run list --workflow "$workflow" --branch "$branch" --status completed \
            --limit 1 --json databaseId --jq '.[0].databaseId // empty' 2>/dev/null) || id=""
        if [[ -n $id ]] && gh run download "$id" --name "$ARTIFACT" --dir "$TARGET"; then
            echo "tightrope: the scorecard of $branch (run $id) is in $TARGET"
            return 0
        fi
    elif [[ ${GITLAB_CI:-} == true ]]; then
        local url="$CI_API_V4_URL/projects/$CI_PROJECT_ID/jobs/artifacts/${branch//\//%2F}/raw/$OUT/scorecard.json?job=$CI_JOB_NAME"
        if curl --fail --silent --show-error --location --header "JOB-TOKEN: $CI_JOB_TOKEN" \
            --output "$TARGET/scorecard.json" "$url"; then
            echo "tightrope: the scorecard of $branch is in $TARGET"
            return 0
        fi
        rm -f "$TARGET/scorecard.json"
    else
        echo "tightrope: fetch-target knows GitHub Actions and GitLab CI; elsewhere put the" \
            "target branch's scorecard.json into $TARGET yourself"
        return 0
    fi
    echo "tightrope: no scorecard of $branch found; nothing to compare with"
}

run_suite() {
    local status=0 compared=0
    "$TIGHTROPE" run "$SUITE" --scorecard "$OUT" --min-score "$MIN_SCORE" "$@" || status=$?
    if [[ -f $OUT/scorecard.md ]]; then
        summary <"$OUT/scorecard.md"
    else
        printf '## tightrope\n\n`tightrope run %s` wrote no scorecard (exit %s).\n' \
            "$SUITE" "$status" | summary
    fi
    if [[ ! -f $TARGET/scorecard.json ]]; then
        echo "tightrope: no target-branch scorecard in $TARGET; nothing compared"
    elif [[ -f $OUT/scorecard.json ]]; then
        "$TIGHTROPE" compare "$TARGET" "$OUT" >"$OUT/compare.md" || compared=$?
        cat "$OUT/compare.md"
        { printf '\n## Against the target branch\n\n'; cat "$OUT/compare.md"; } | summary
        case $compared in
        0) ;;
        1)
            annotate error "resilience regressed against the target branch (compare.md)"
            if [[ $status -eq 0 ]]; then status=1; fi
            ;;
        *) annotate warning "the target branch's scorecard could not be compared (exit $compared)" ;;
        esac
    fi
    if [[ $status -ne 0 ]]; then
        annotate error "tightrope run $SUITE failed (exit $status; minimum score $MIN_SCORE)"
    fi
    return "$status"
}

case ${1:-} in
fetch-target) fetch_target ;;
run)
    shift
    run_suite "$@"
    ;;
*)
    echo "usage: $0 fetch-target | run [tightrope run ARGS...]" >&2
    exit 2
    ;;
esac
