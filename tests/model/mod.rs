//! The protocol model (`services/domain/model/saga.pml`), checked with Spin:
//! every interleaving of reserve, pay (lost, duplicated, reordered and late
//! answers, 3-D Secure), cancel, expire, reclaim, ship and capture, void,
//! refund, reconcile and an operator's cancel keeps the promise, and so do
//! disputes and their holds with money taken at once or at shipment,
//! and the model does catch the bugs soldonce once had.

use std::path::Path;
use std::process::Command;

const MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../services/domain/model/saga.pml"
);

/// What one exhaustive search found.
struct Verdict {
    errors: u64,
    states: u64,
    /// The replayed counterexample's narration (the model's `MSC:` lines) and
    /// the assertion it broke, when there is one.
    counterexample: String,
    output: String,
}

fn run(dir: &Path, program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("{program}: {e} (install Debian's spin and gcc: . deploy/setup.sh)")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() || program == "./pan",
        "{program} {args:?} failed:\n{text}"
    );
    text
}

/// Generates, compiles and runs the verifier for the model with `defines`.
fn check(defines: &[&str]) -> Verdict {
    let dir = tempfile::tempdir().expect("scratch dir");
    std::fs::copy(MODEL, dir.path().join("saga.pml")).expect("copy the model");
    let mut spin_args: Vec<String> = defines.iter().map(|d| format!("-D{d}")).collect();
    spin_args.push("-a".into());
    spin_args.push("saga.pml".into());
    let spin_args: Vec<&str> = spin_args.iter().map(String::as_str).collect();
    run(dir.path(), "spin", &spin_args);
    run(
        dir.path(),
        "cc",
        &["-O2", "-DSAFETY", "-DMEMLIM=4096", "-o", "pan", "pan.c"],
    );
    // -i: keep searching for shorter counterexamples; the last one written is the shortest.
    let output = run(dir.path(), "./pan", &["-m100000", "-i"]);
    let figure = |label: &str| -> u64 {
        output
            .lines()
            .find_map(|l| {
                let l = l.trim();
                l.split_once(label).and_then(|(before, after)| {
                    if label == "errors:" {
                        after.trim().parse().ok()
                    } else {
                        before.trim().parse().ok()
                    }
                })
            })
            .unwrap_or_else(|| panic!("no {label:?} in Spin's output:\n{output}"))
    };
    let errors = figure("errors:");
    let states = figure("states, stored");
    let counterexample = if errors > 0 {
        let replay_args: Vec<String> = defines
            .iter()
            .map(|d| format!("-D{d}"))
            .chain(["-t".into(), "saga.pml".into()])
            .collect();
        let text = run(
            dir.path(),
            "spin",
            &replay_args.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        text.lines()
            .map(str::trim)
            .filter(|l| {
                l.starts_with("MSC:")
                    || l.contains("assertion violated")
                    || l.contains("text of failed assertion")
            })
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        String::new()
    };
    Verdict {
        errors,
        states,
        counterexample,
        output,
    }
}

#[test]
fn no_interleaving_sells_a_unit_twice_keeps_a_payment_unowned_or_leaves_an_order_open() {
    let verdict = check(&[]);
    assert_eq!(
        verdict.errors, 0,
        "the model breaks the promise:\n{}\n{}",
        verdict.counterexample, verdict.output
    );
    assert!(
        verdict.states > 100_000,
        "the search explored only {} states: {}",
        verdict.states,
        verdict.output
    );
}

#[test]
fn disputes_hold_unshipped_goods_and_decide_no_money_in_every_interleaving() {
    // Either capture method per payment, disputes of any payment (two on one order), a hold per
    // dispute, findings, reconciliation recording disputes, operator refunds and cancels.
    let verdict = check(&["DISPUTES"]);
    assert_eq!(
        verdict.errors, 0,
        "the model breaks the promise:\n{}\n{}",
        verdict.counterexample, verdict.output
    );
    assert!(
        verdict.states > 100_000,
        "the search explored only {} states: {}",
        verdict.states,
        verdict.output
    );
}

#[test]
fn the_webhook_path_before_reconciliation_fails_the_model_with_a_counterexample() {
    // A success for an order that is no longer pending was acknowledged and forgotten.
    let verdict = check(&["NAIVE_WEBHOOK"]);
    assert!(
        verdict.errors > 0,
        "the old bug went unnoticed:\n{}",
        verdict.output
    );
    assert!(
        verdict
            .counterexample
            .contains("acknowledged and forgotten")
            && verdict.counterexample.contains("assertion violated"),
        "the counterexample shows the forgotten charge:\n{}",
        verdict.counterexample
    );
}

#[test]
fn a_late_payment_that_undoes_a_cancel_fails_the_model() {
    // Confirming whatever became of the order sells the released unit twice.
    let verdict = check(&["UNDO_CANCEL"]);
    assert!(
        verdict.errors > 0,
        "the bug went unnoticed:\n{}",
        verdict.output
    );
    assert!(
        verdict.counterexample.contains("confirmed again")
            && verdict.counterexample.contains("assertion violated"),
        "the counterexample shows the order confirmed again:\n{}",
        verdict.counterexample
    );
}

#[test]
fn without_expiry_an_order_whose_answer_is_lost_never_ends_and_the_model_says_so() {
    let verdict = check(&["NO_EXPIRY"]);
    assert!(
        verdict.errors > 0,
        "a stuck order went unnoticed:\n{}",
        verdict.output
    );
    assert!(
        verdict.counterexample.contains("!=PENDING"),
        "the counterexample ends with an order still pending:\n{}",
        verdict.counterexample
    );
}

#[test]
fn compensating_an_authorization_with_a_refund_leaves_it_open_and_the_model_says_so() {
    // Nothing was captured, so the PSP refuses the refund: the authorization never ends.
    let verdict = check(&["REFUND_NOT_VOID"]);
    assert!(
        verdict.errors > 0,
        "the open authorization went unnoticed:\n{}",
        verdict.output
    );
    assert!(
        verdict
            .counterexample
            .contains("a refund of an authorization, refused")
            && verdict.counterexample.contains("psp[p]!=AUTH"),
        "the counterexample ends with an authorization still open:\n{}",
        verdict.counterexample
    );
}

#[test]
fn an_operator_cancel_that_ignores_the_shipment_fails_the_model() {
    // Cancelling an order whose goods left voids a capture decided, or stops goods that left.
    let verdict = check(&["CANCEL_AFTER_SHIPPING"]);
    assert!(
        verdict.errors > 0,
        "the cancel of shipped goods went unnoticed:\n{}",
        verdict.output
    );
    assert!(
        verdict.counterexample.contains("an operator cancels order")
            && verdict.counterexample.contains("assertion violated"),
        "the counterexample shows the cancel:\n{}",
        verdict.counterexample
    );
}

#[test]
fn a_warehouse_step_that_trusts_its_first_snapshot_ships_a_held_shipment() {
    // advance_due must look for holds again once it holds its rows.
    let verdict = check(&["DISPUTES", "HOLD_NOT_RECHECKED"]);
    assert!(
        verdict.errors > 0,
        "the shipped hold went unnoticed:\n{}",
        verdict.output
    );
    assert!(
        verdict.counterexample.contains("no hold in its snapshot")
            && verdict.counterexample.contains("shipment held")
            && verdict.counterexample.contains("!(hold[(2*i)])"),
        "the counterexample ships a held shipment:\n{}",
        verdict.counterexample
    );
}
