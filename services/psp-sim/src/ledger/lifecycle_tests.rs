use super::*;
use crate::model::{
    ActionOutcome, CancellationReason, CaptureMethod, DisputeRequest, FailureReason,
};

fn request(amount_minor: i64, capture_method: CaptureMethod) -> PaymentRequest {
    PaymentRequest {
        amount_minor,
        currency: "BRL".to_owned(),
        reference: "ord_1".to_owned(),
        capture_method,
    }
}

const AUTHORIZED: Roll = Roll {
    outcome: Outcome::Succeeded,
    processing: false,
    action_required: false,
};
const AWAITING_BUYER: Roll = Roll {
    outcome: Outcome::Failed,
    processing: false,
    action_required: true,
};

fn charged(ledger: &mut Ledger, key: &str, method: CaptureMethod, roll: Roll) -> Payment {
    match ledger.charge(key, request(1000, method), roll, Utc::now()) {
        Ok(Recorded::Created(payment)) => payment,
        other => panic!("expected a new payment, got {other:?}"),
    }
}

fn held(ledger: &mut Ledger, key: &str) -> Payment {
    charged(ledger, key, CaptureMethod::Manual, AUTHORIZED)
}

fn capture(amount_minor: Option<i64>) -> CaptureRequest {
    CaptureRequest { amount_minor }
}

#[test]
fn a_partial_capture_succeeds_releases_the_rest_and_bounds_refunds() {
    let mut ledger = Ledger::default();
    let payment = held(&mut ledger, "k");
    assert_eq!(
        (payment.status, payment.amount_captured),
        (PaymentStatus::RequiresCapture, 0)
    );
    assert_eq!(ledger.awaiting_capture()[0].0, payment.id);

    let captured = ledger
        .capture(&payment.id, "c1", capture(Some(600)), Utc::now())
        .unwrap();

    let Recorded::Created(captured) = captured else {
        panic!("not new")
    };
    assert_eq!(
        (captured.status, captured.amount_captured),
        (PaymentStatus::Succeeded, 600)
    );
    assert!(ledger.awaiting_capture().is_empty());
    let replay = ledger.capture(&payment.id, "c1", capture(Some(600)), Utc::now());
    assert_eq!(replay, Ok(Recorded::Replayed(captured)));
    let reuse = ledger.capture(&payment.id, "c1", capture(None), Utc::now());
    assert_eq!(reuse, Err(LedgerError::KeyReused));
    let again = ledger.capture(&payment.id, "c2", capture(None), Utc::now());
    assert!(matches!(
        again,
        Err(LedgerError::NotCapturable {
            status: PaymentStatus::Succeeded,
            ..
        })
    ));
    let refund = ledger.refund(
        &payment.id,
        "r",
        RefundRequest {
            amount_minor: Some(601),
        },
        Utc::now(),
    );
    assert_eq!(
        refund,
        Err(LedgerError::ExceedsRemaining {
            requested: 601,
            remaining: 600
        })
    );
}

#[test]
fn a_capture_above_the_authorization_changes_nothing_and_frees_its_key() {
    let mut ledger = Ledger::default();
    let payment = held(&mut ledger, "k");
    let over = ledger.capture(&payment.id, "c", capture(Some(1001)), Utc::now());
    assert_eq!(
        over,
        Err(LedgerError::CaptureExceedsAuthorized {
            requested: 1001,
            authorized: 1000
        })
    );
    assert_eq!(ledger.payment(&payment.id), Some(payment.clone()));
    assert!(matches!(
        ledger.capture(&payment.id, "c", capture(None), Utc::now()),
        Ok(Recorded::Created(_))
    ));
}

#[test]
fn a_cancel_replays_by_key_and_a_new_key_is_refused() {
    let mut ledger = Ledger::default();
    let payment = held(&mut ledger, "k");
    let Ok(Recorded::Created(canceled)) = ledger.cancel(&payment.id, "v1", Utc::now()) else {
        panic!("not canceled");
    };
    assert_eq!(
        canceled.cancellation_reason,
        Some(CancellationReason::Requested)
    );
    assert_eq!(
        ledger.cancel(&payment.id, "v1", Utc::now()),
        Ok(Recorded::Replayed(canceled))
    );
    let twice = ledger.cancel(&payment.id, "v2", Utc::now());
    assert!(matches!(
        twice,
        Err(LedgerError::NotCancelable {
            status: PaymentStatus::Canceled,
            ..
        })
    ));
    assert_eq!(ledger.expire(&payment.id, Utc::now()), Ok(None));
    let refund = ledger.refund(&payment.id, "r", RefundRequest::default(), Utc::now());
    assert!(matches!(refund, Err(LedgerError::NotRefundable { .. })));
}

#[test]
fn the_buyer_acts_once_and_only_on_a_payment_awaiting_them() {
    let mut ledger = Ledger::default();
    ledger.set_public_url("http://psp:1/");
    let waiting = charged(&mut ledger, "a", CaptureMethod::Automatic, AWAITING_BUYER);
    assert_eq!(waiting.status, PaymentStatus::RequiresAction);
    let url = waiting.next_action.map(|action| action.url);
    assert_eq!(
        url,
        Some(format!("http://psp:1/v1/payments/{}/action", waiting.id))
    );

    let failed = ledger
        .act(&waiting.id, ActionOutcome::Failed, Utc::now())
        .unwrap();

    assert_eq!(
        failed.failure_reason,
        Some(FailureReason::AuthenticationFailed)
    );
    assert_eq!(failed.next_action, None);
    let again = ledger.act(&waiting.id, ActionOutcome::Succeeded, Utc::now());
    assert!(matches!(
        again,
        Err(LedgerError::NotAwaitingAction {
            status: PaymentStatus::Failed,
            ..
        })
    ));
    // A successful action authorizes directly, whatever the decline roll said.
    let manual = charged(&mut ledger, "m", CaptureMethod::Manual, AWAITING_BUYER);
    let held = ledger
        .act(&manual.id, ActionOutcome::Succeeded, Utc::now())
        .unwrap();
    assert_eq!(held.status, PaymentStatus::RequiresCapture);
}

#[test]
fn a_dispute_takes_back_what_is_left_and_no_more() {
    let mut ledger = Ledger::default();
    let payment = charged(&mut ledger, "k", CaptureMethod::Automatic, AUTHORIZED);
    let over = DisputeRequest {
        amount_minor: Some(1001),
        ..DisputeRequest::default()
    };
    assert!(matches!(
        ledger.dispute(&payment.id, over, Utc::now()),
        Err(LedgerError::DisputeExceedsRemaining {
            remaining: 1000,
            ..
        })
    ));
    let dispute = ledger
        .dispute(&payment.id, DisputeRequest::default(), Utc::now())
        .unwrap();
    assert_eq!(dispute.amount_minor, 1000);
    let nothing = ledger.dispute(&payment.id, DisputeRequest::default(), Utc::now());
    assert!(matches!(
        nothing,
        Err(LedgerError::NotDisputable { remaining: 0, .. })
    ));
    let refund = ledger.refund(&payment.id, "r", RefundRequest::default(), Utc::now());
    assert!(matches!(
        refund,
        Err(LedgerError::ExceedsRemaining { remaining: 0, .. })
    ));
}

#[test]
fn replaying_the_changes_rebuilds_the_same_books_and_timers() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = Ledger::open(dir.path()).unwrap();
    let captured = held(&mut ledger, "k1");
    ledger
        .capture(&captured.id, "c", capture(Some(10)), Utc::now())
        .unwrap();
    let pending = held(&mut ledger, "k2");
    let expired = held(&mut ledger, "k3");
    ledger.expire(&expired.id, Utc::now()).unwrap();
    let abandoned = charged(&mut ledger, "k4", CaptureMethod::Manual, AWAITING_BUYER);
    ledger
        .act(&abandoned.id, ActionOutcome::Abandoned, Utc::now())
        .unwrap();
    ledger
        .dispute(&captured.id, DisputeRequest::default(), Utc::now())
        .unwrap();
    let before = ledger.payments_page(&PageRequest {
        created_gte: None,
        after: None,
        limit: 10,
    });
    let awaiting = ledger.awaiting_capture();
    drop(ledger);

    let mut again = Ledger::open(dir.path()).unwrap();

    let after = again.payments_page(&PageRequest {
        created_gte: None,
        after: None,
        limit: 10,
    });
    assert_eq!(after.items, before.items);
    assert_eq!(again.awaiting_capture(), awaiting);
    assert_eq!(awaiting[0].0, pending.id);
    let reason = again
        .payment(&expired.id)
        .and_then(|p| p.cancellation_reason);
    assert_eq!(reason, Some(CancellationReason::Expired));
    let replay = again.capture(&captured.id, "c", capture(Some(10)), Utc::now());
    assert!(matches!(replay, Ok(Recorded::Replayed(_))));
}

#[test]
fn a_change_the_rules_forbid_is_refused_on_replay() {
    let mut ledger = Ledger::default();
    let payment = charged(&mut ledger, "k", CaptureMethod::Automatic, AUTHORIZED);
    let capture = Entry::PaymentCaptured {
        payment_id: payment.id.clone(),
        idempotency_key: "c".to_owned(),
        request: capture(None),
        amount_captured: 1000,
        captured_at: Utc::now(),
    };
    let error = ledger.apply(capture).unwrap_err().to_string();
    assert!(error.contains("only a requires_capture payment"), "{error}");
    let expire = Entry::PaymentCanceled {
        payment_id: payment.id,
        idempotency_key: None,
        reason: CancellationReason::Expired,
        canceled_at: Utc::now(),
    };
    assert!(ledger.apply(expire).is_err());
}
