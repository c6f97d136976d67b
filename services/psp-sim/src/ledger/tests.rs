use super::*;
use crate::model::{CaptureMethod, FailureReason};

fn request(amount_minor: i64, reference: &str) -> PaymentRequest {
    PaymentRequest {
        amount_minor,
        currency: "BRL".to_owned(),
        reference: reference.to_owned(),
        capture_method: CaptureMethod::Automatic,
    }
}

const PAID: Roll = Roll {
    outcome: Outcome::Succeeded,
    processing: false,
    action_required: false,
};
const DECLINED: Roll = Roll {
    outcome: Outcome::Failed,
    processing: false,
    action_required: false,
};

fn created<T: std::fmt::Debug>(recorded: Recorded<T>) -> T {
    match recorded {
        Recorded::Created(value) => value,
        other => panic!("expected Created, got {other:?}"),
    }
}

fn charged_with(ledger: &mut Ledger, key: &str, amount: i64, roll: Roll) -> Payment {
    created(
        ledger
            .charge(key, request(amount, "ord_1"), roll, Utc::now())
            .unwrap(),
    )
}

fn charged(ledger: &mut Ledger, key: &str, amount: i64) -> Payment {
    charged_with(ledger, key, amount, PAID)
}

fn page(created_gte: Option<DateTime<Utc>>, after: Option<Position>, limit: usize) -> PageRequest {
    PageRequest {
        created_gte,
        after,
        limit,
    }
}

#[test]
fn the_same_key_and_request_replays_the_first_payment() {
    let mut ledger = Ledger::default();
    let first = charged(&mut ledger, "k", 100);
    let again = ledger.charge("k", request(100, "ord_1"), DECLINED, Utc::now());
    assert_eq!(again, Ok(Recorded::Replayed(first)));
    assert_eq!(ledger.payments_for_reference("ord_1").len(), 1);
}

#[test]
fn the_same_key_with_another_request_is_refused() {
    let mut ledger = Ledger::default();
    charged(&mut ledger, "k", 100);
    let again = ledger.charge("k", request(101, "ord_1"), PAID, Utc::now());
    assert_eq!(again, Err(LedgerError::KeyReused));
}

#[test]
fn a_declined_charge_is_failed_with_a_reason() {
    let mut ledger = Ledger::default();
    let payment = charged_with(&mut ledger, "k", 5, DECLINED);
    assert_eq!(payment.status, PaymentStatus::Failed);
    assert_eq!(payment.failure_reason, Some(FailureReason::CardDeclined));
    let refund = ledger.refund(&payment.id, "r", RefundRequest::default(), Utc::now());
    assert_eq!(
        refund,
        Err(LedgerError::NotRefundable {
            payment_id: payment.id,
            status: PaymentStatus::Failed
        })
    );
}

#[test]
fn refunds_stop_at_the_amount_paid() {
    let mut ledger = Ledger::default();
    let payment = charged(&mut ledger, "k", 100);
    let part = RefundRequest {
        amount_minor: Some(60),
    };
    created(
        ledger
            .refund(&payment.id, "r1", part.clone(), Utc::now())
            .unwrap(),
    );
    let too_much = ledger.refund(&payment.id, "r2", part, Utc::now());
    assert_eq!(
        too_much,
        Err(LedgerError::ExceedsRemaining {
            requested: 60,
            remaining: 40
        })
    );
    let rest = created(
        ledger
            .refund(&payment.id, "r3", RefundRequest::default(), Utc::now())
            .unwrap(),
    );
    assert_eq!(rest.amount_minor, 40);
    let nothing_left = ledger.refund(&payment.id, "r4", RefundRequest::default(), Utc::now());
    assert!(matches!(
        nothing_left,
        Err(LedgerError::ExceedsRemaining { remaining: 0, .. })
    ));
}

#[test]
fn a_refund_key_replays_and_refuses_other_requests() {
    let mut ledger = Ledger::default();
    let payment = charged(&mut ledger, "k", 100);
    let refund = created(
        ledger
            .refund(&payment.id, "r", RefundRequest::default(), Utc::now())
            .unwrap(),
    );
    let again = ledger.refund(&payment.id, "r", RefundRequest::default(), Utc::now());
    assert_eq!(again, Ok(Recorded::Replayed(refund)));
    let other = RefundRequest {
        amount_minor: Some(1),
    };
    let reused = ledger.refund(&payment.id, "r", other, Utc::now());
    assert_eq!(reused, Err(LedgerError::KeyReused));
    assert_eq!(ledger.payment(&payment.id).unwrap().refunds.len(), 1);
}

#[test]
fn an_unknown_payment_cannot_be_refunded() {
    let mut ledger = Ledger::default();
    let refund = ledger.refund("pay_x", "r", RefundRequest::default(), Utc::now());
    assert_eq!(
        refund,
        Err(LedgerError::PaymentNotFound("pay_x".to_owned()))
    );
}

#[test]
fn a_processing_payment_cannot_be_refunded_until_it_settles_as_rolled() {
    let mut ledger = Ledger::default();
    let roll = Roll {
        outcome: Outcome::Failed,
        processing: true,
        action_required: false,
    };
    let payment = charged_with(&mut ledger, "k", 100, roll);
    assert_eq!(payment.status, PaymentStatus::Processing);
    assert_eq!(payment.failure_reason, None);
    let refund = ledger.refund(&payment.id, "r", RefundRequest::default(), Utc::now());
    assert_eq!(
        refund,
        Err(LedgerError::PaymentProcessing(payment.id.clone()))
    );
    assert_eq!(ledger.unsettled(), [payment.id.as_str()]);

    let settled = ledger.settle(&payment.id, Utc::now()).unwrap().unwrap();

    assert_eq!(settled.status, PaymentStatus::Failed);
    assert_eq!(settled.failure_reason, Some(FailureReason::CardDeclined));
    assert_eq!(settled.created_at, payment.created_at);
    assert_eq!(ledger.settle(&payment.id, Utc::now()), Ok(None));
    assert!(ledger.unsettled().is_empty());
}

#[test]
fn creation_times_only_go_forward_even_when_the_clock_does_not() {
    let mut ledger = Ledger::default();
    let now = Utc::now();
    let first = created(ledger.charge("a", request(1, "o"), PAID, now).unwrap());
    let second = created(ledger.charge("b", request(1, "o"), PAID, now).unwrap());
    let earlier = now - TimeDelta::seconds(5);
    let refund = ledger
        .refund(&first.id, "r", RefundRequest::default(), earlier)
        .unwrap();
    assert!(first.created_at < second.created_at);
    assert!(second.created_at < created(refund).created_at);
}

#[test]
fn pages_follow_creation_order_and_resume_after_their_last_item() {
    let mut ledger = Ledger::default();
    let payments: Vec<Payment> = (0..5)
        .map(|i| charged(&mut ledger, &format!("k{i}"), 10))
        .collect();

    let first = ledger.payments_page(&page(None, None, 2));
    assert_eq!(first.items, payments[..2]);
    assert!(first.has_more);
    let more = charged(&mut ledger, "k-late", 10);
    let second = ledger.payments_page(&page(None, first.last, 10));
    assert_eq!(second.items[..3], payments[2..]);
    assert_eq!(second.items[3], more);
    assert!(!second.has_more);

    let newer = ledger.payments_page(&page(Some(payments[3].created_at), None, 10));
    assert_eq!(newer.items[0], payments[3]);
    assert_eq!(newer.items.len(), 3);
    let empty = ledger.payments_page(&page(Some(Utc::now() + TimeDelta::days(1)), None, 10));
    assert_eq!(
        (empty.items.len(), empty.has_more, empty.last),
        (0, false, None)
    );
}

#[test]
fn refunds_are_listed_across_payments_by_creation_time() {
    let mut ledger = Ledger::default();
    let a = charged(&mut ledger, "a", 100);
    let b = charged(&mut ledger, "b", 100);
    let part = || RefundRequest {
        amount_minor: Some(10),
    };
    let r1 = created(ledger.refund(&a.id, "r1", part(), Utc::now()).unwrap());
    let r2 = created(ledger.refund(&b.id, "r2", part(), Utc::now()).unwrap());
    let r3 = created(ledger.refund(&a.id, "r3", part(), Utc::now()).unwrap());

    let listed = ledger.refunds_page(&page(None, None, 10));

    assert_eq!(listed.items, [r1, r2.clone(), r3]);
    assert_eq!(ledger.refund_by_id(&r2.id), Some(r2));
}

#[test]
fn replaying_the_entries_rebuilds_the_same_books() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = Ledger::open(dir.path()).unwrap();
    let paid = charged(&mut ledger, "k1", 100);
    let processing = Roll {
        outcome: Outcome::Succeeded,
        processing: true,
        action_required: false,
    };
    let pending = charged_with(&mut ledger, "k2", 100, processing);
    let settling = charged_with(&mut ledger, "k3", 100, processing);
    ledger.settle(&settling.id, Utc::now()).unwrap();
    let refund = created(
        ledger
            .refund(&paid.id, "r", RefundRequest::default(), Utc::now())
            .unwrap(),
    );
    drop(ledger);

    let mut again = Ledger::open(dir.path()).unwrap();

    let all = again.payments_page(&page(None, None, 10)).items;
    assert_eq!(all.len(), 3);
    assert_eq!(all[0].refunds, std::slice::from_ref(&refund));
    assert_eq!(all[2].status, PaymentStatus::Succeeded);
    assert_eq!(again.unsettled(), [pending.id.as_str()]);
    let replay = again.charge("k1", request(100, "ord_1"), DECLINED, Utc::now());
    assert_eq!(replay, Ok(Recorded::Replayed(all[0].clone())));
    let replay = again.refund(&paid.id, "r", RefundRequest::default(), Utc::now());
    assert_eq!(replay, Ok(Recorded::Replayed(refund)));
}

#[test]
fn an_entry_that_does_not_fit_the_books_is_refused() {
    let mut ledger = Ledger::default();
    let settled = Entry::PaymentSettled {
        payment_id: "pay_x".to_owned(),
        settled_at: Utc::now(),
    };
    let error = ledger.apply(settled).unwrap_err();
    assert_eq!(error.to_string(), "payment pay_x is not processing");
}
