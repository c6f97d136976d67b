#!/usr/bin/env bash
# Layer lines nothing else checks, one line per finding:
#   - SQL runs only in services/store (services/localservers starts servers
#     and may talk to them); the root tests/ directory is exempt, since tests
#     count business facts in the database on their own; so is
#     services/cli/src/bench/sql.rs, the flash-sale bench's strawman
#     strategies (read-check-write and friends, measured against soldonce's
#     checkout) over tables of their own in a database the bench creates
#     and drops;
#   - the pure crates (domain, events) never depend on tokio, sqlx or async-nats;
#   - no crate under services/ depends on a program's crate (one with a
#     src/main.rs): what two programs share lives in a library crate;
#   - psp-sim, the stand-in for another company's provider, depends on no
#     crate of soldonce's but platform.
#   - one concern per module (issue 39): no function in services/*/src over
#     80 lines, counted from its `fn` line to the next line holding only `}`
#     at the same indentation, and no file there over 450 lines. Test code
#     is exempt: files named *_tests.rs or tests.rs (test modules' own
#     files), and the rest of a file from a #[cfg(test)] line on (unless
#     that line only declares such an out-of-line module). Three functions
#     are allowed longer, each a flat match (an arm per command, event or
#     error), since a flat match reads best whole: checkout's error.rs
#     `problem`, and domain's order.rs `decide_existing` and `evolve`.
# Usage, from anywhere in the checkout: bash scripts/lint.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

findings=0
finding() {
    echo "lint: $*"
    findings=$((findings + 1))
}

# A query through sqlx, by path or imported; comment lines do not count.
sql='sqlx::(query|query_as|query_scalar|query_with|query_as_with|query_scalar_with|raw_sql)\b|use sqlx::\{[^}]*\b(query|query_as|query_scalar|raw_sql)\b'
while IFS= read -r -d '' file; do
    while IFS=: read -r line text; do
        [[ "${text#"${text%%[![:space:]]*}"}" == //* ]] && continue
        finding "$file:$line: SQL outside services/store; move it into a store function"
    done < <(grep -nE "$sql" "$file" || true)
done < <(find services/*/src services/*/tests -name '*.rs' \
    -not -path 'services/store/*' -not -path 'services/localservers/*' \
    -not -path 'services/cli/src/bench/sql.rs' -print0 2>/dev/null | sort -z)

for crate in domain events; do
    deps=$(cargo tree -p "$crate" -e normal --prefix none --format '{p}' | awk '{print $1}' | sort -u)
    for forbidden in $(grep -xE 'tokio|sqlx|sqlx-[a-z-]+|async-nats' <<<"$deps" || true); do
        finding "$crate depends on $forbidden (cargo tree -p $crate -e normal); it must stay free of IO runtimes"
    done
done

# Each services/ package's name, whether it is a program, and its normal dependencies.
declare -A program=() package=()
for dir in services/*/; do
    name=$(sed -n 's/^name = "\(.*\)"/\1/p' "$dir/Cargo.toml" | head -n 1)
    package[$name]=$dir
    [[ -f $dir/src/main.rs ]] && program[$name]=1
done
dependencies() {
    sed -n '/^\[dependencies\]/,/^\[/p' "$1/Cargo.toml" | sed -n 's/^\([A-Za-z0-9_-]*\)\( *=\|\.workspace\).*/\1/p'
}
for name in "${!package[@]}"; do
    for dep in $(dependencies "${package[$name]}"); do
        [[ -n ${program[$dep]:-} ]] \
            && finding "$name depends on $dep, a program: move what they share into a library crate"
        [[ $name == psp-sim && -n ${package[$dep]:-} && $dep != platform ]] \
            && finding "psp-sim depends on $dep: the stand-in for another company's provider may use platform only"
    done
done

# Size, in production code. A function runs from its `fn` line to the next
# line holding only `}` at the same indentation; a file's production code
# ends where test code begins.
long_allowed='services/checkout/src/error.rs:problem services/domain/src/order.rs:decide_existing services/domain/src/order.rs:evolve'
while IFS= read -r line; do
    finding "$line"
done < <(find services/*/src -name '*.rs' -not -name '*_tests.rs' -not -name tests.rs -print0 | sort -z |
    xargs -0 awk -v allowed="$long_allowed" '
    function file_done() {
        if (file != "" && production > 450)
            print file ": " production " lines of production code (over 450); move a concern into a module file of its own"
    }
    BEGIN {
        n = split(allowed, list, " ")
        for (i = 1; i <= n; i++) allow[list[i]] = 1
    }
    FNR == 1 { file_done(); file = FILENAME; skip = 0; pending = 0; production = 0; split("", open) }
    skip { next }
    # After #[cfg(test)] and any further attributes: an out-of-line module
    # (its file is exempt by name) or test code to the end of the file.
    pending {
        if ($0 ~ /^[[:space:]]*#\[/) next
        if ($0 ~ /^[[:space:]]*(pub(\([^)]*\))? )?mod [A-Za-z_0-9]+;/) { pending = 0; production = FNR; next }
        skip = 1
        next
    }
    /^[[:space:]]*#\[cfg\(test\)\]/ { pending = 1; next }
    { production = FNR }
    match($0, /^[[:space:]]*(pub(\([^)]*\))? )?((async|const) )*fn [A-Za-z_][A-Za-z_0-9]*/) {
        # A declaration without a body, or a body on the same line, is short.
        if ($0 ~ /;[[:space:]]*$/ || $0 ~ /\{.*\}[[:space:]]*$/) next
        name = substr($0, RSTART, RLENGTH)
        sub(/.*fn /, "", name)
        indent = $0
        sub(/[^[:space:]].*/, "", indent)
        open[length(indent)] = FNR
        names[length(indent)] = name
        next
    }
    /^[[:space:]]*\}[[:space:]]*$/ {
        indent = $0
        sub(/\}.*/, "", indent)
        depth = length(indent)
        if (depth in open) {
            lines = FNR - open[depth] + 1
            if (lines > 80 && !((file ":" names[depth]) in allow))
                print file ":" open[depth] ": fn " names[depth] " is " lines " lines (over 80); split it into named steps"
            delete open[depth]
        }
        # A closing brace also closes any deeper signature left open (one without a body).
        for (d in open) if (d + 0 > depth) delete open[d]
    }
    END { file_done() }
')

if ((findings > 0)); then
    echo "lint: $findings finding(s)"
    exit 1
fi
echo "lint: clean"
