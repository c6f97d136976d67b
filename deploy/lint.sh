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
# Usage, from anywhere in the checkout: bash deploy/lint.sh
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

if ((findings > 0)); then
    echo "lint: $findings finding(s)"
    exit 1
fi
echo "lint: clean"
