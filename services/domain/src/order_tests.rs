use super::*;
use crate::{DisputeFact, MoneyError, Movement, PaidFact, Quantity, RefundReason, Sku};
use chrono::{DateTime, TimeZone, Utc};
use uuid::Uuid;

fn t(secs: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000 + secs, 0)
        .single()
        .expect("valid time")
}

fn brl(minor: i64) -> Money {
    Money::new(minor, "BRL".parse().expect("currency")).expect("money")
}

fn line(sku: &str, q: i64, price: i64) -> (Sku, Quantity, Money) {
    (
        Sku::parse(sku).expect("sku"),
        Quantity::new(q).expect("quantity"),
        brl(price),
    )
}

fn place(lines: Vec<(Sku, Quantity, Money)>) -> Command {
    Command::Place(PlaceOrder {
        order_id: Uuid::nil(),
        account_id: Uuid::nil(),
        lines,
        shipping: None,
        placed_at: t(0),
        expires_at: t(900),
    })
}

/// `given(events).when(command)` yields the events or the error `then` expects.
struct Given(Vec<Event>);

fn given(events: Vec<Event>) -> Given {
    Given(events)
}

impl Given {
    fn when(self, command: Command) -> Result<Vec<Event>, DomainError> {
        decide(fold(&self.0).as_ref(), command)
    }
}

fn placed() -> Event {
    decide(None, place(vec![line("B", 2, 500), line("A", 1, 1000)]))
        .expect("placed")
        .remove(0)
}

fn paid_with(p: &str, amount_minor: i64, currency: &str) -> Command {
    Command::Paid {
        fact: PaidFact {
            payment_id: p.into(),
            amount_minor,
            currency: currency.into(),
            captured: true,
            at: t(10),
        },
        units_gone: false,
        holdings: vec![],
    }
}

fn confirm(p: &str) -> Command {
    paid_with(p, 2000, "BRL")
}

fn refund_decided(p: &str, reason: RefundReason) -> Event {
    Event::RefundDecided {
        payment_id: p.into(),
        amount_minor: 2000,
        currency: "BRL".into(),
        reason,
        void: false,
        at: t(10),
    }
}

fn confirmed(p: &str) -> Event {
    Event::Confirmed {
        payment_id: p.into(),
        amount_minor: 2000,
        reactivated: false,
        uncaptured: false,
        at: t(10),
    }
}

/// The PSP holds the order's total for a later capture (`requires_capture`).
fn authorized(p: &str) -> Command {
    match confirm(p) {
        Command::Paid {
            fact,
            units_gone,
            holdings,
        } => Command::Paid {
            fact: PaidFact {
                captured: false,
                ..fact
            },
            units_gone,
            holdings,
        },
        other => other,
    }
}

fn capture_decided(p: &str) -> Event {
    Event::CaptureDecided {
        payment_id: p.into(),
        amount_minor: 2000,
        at: t(20),
    }
}

fn fail() -> Command {
    Command::FailPayment {
        payment_id: None,
        reason: "declined".into(),
        abandoned: false,
        at: t(10),
    }
}

#[test]
fn placing_prices_from_the_catalogue_and_sorts_lines_by_sku() {
    let Event::Placed {
        lines, total_minor, ..
    } = placed()
    else {
        panic!("not placed")
    };
    assert_eq!(total_minor, 2 * 500 + 1000);
    let skus: Vec<_> = lines.iter().map(|l| l.sku.as_str().to_owned()).collect();
    assert_eq!(skus, ["A", "B"]);
    assert_eq!(
        fold(&[placed()]).expect("order").state,
        OrderState::PaymentPending
    );
}

#[test]
fn placing_refuses_bad_line_sets() {
    assert_eq!(
        given(vec![]).when(place(vec![])),
        Err(DomainError::LineCount(0))
    );
    let many = (0..=MAX_LINES)
        .map(|i| line(&format!("S{i}"), 1, 1))
        .collect();
    assert_eq!(
        given(vec![]).when(place(many)),
        Err(DomainError::LineCount(MAX_LINES + 1))
    );
    assert!(matches!(
        given(vec![]).when(place(vec![line("A", 1, 1), line("A", 2, 1)])),
        Err(DomainError::DuplicateSku(_))
    ));
    assert_eq!(
        given(vec![]).when(place(vec![line("A", 2, i64::MAX)])),
        Err(DomainError::Money(MoneyError::Overflow))
    );
    let usd = (
        Sku::parse("U").expect("sku"),
        Quantity::new(1).expect("q"),
        Money::new(1, "USD".parse().expect("c")).expect("m"),
    );
    assert!(matches!(
        given(vec![]).when(place(vec![line("A", 1, 1), usd])),
        Err(DomainError::Money(MoneyError::CurrencyMismatch(_, _)))
    ));
    assert_eq!(
        given(vec![placed()]).when(place(vec![line("A", 1, 1)])),
        Err(DomainError::AlreadyExists)
    );
}

#[test]
fn a_pending_order_moves_to_each_of_its_outcomes() {
    assert_eq!(
        given(vec![placed()]).when(confirm("p1")),
        Ok(vec![confirmed("p1")])
    );
    assert_eq!(
        given(vec![placed()]).when(fail()),
        Ok(vec![Event::PaymentFailed {
            payment_id: None,
            reason: "declined".into(),
            at: t(10)
        }])
    );
    assert_eq!(
        given(vec![placed()]).when(Command::Cancel { at: t(5) }),
        Ok(vec![Event::Cancelled { at: t(5) }])
    );
    assert_eq!(
        given(vec![placed()]).when(Command::Expire { at: t(900) }),
        Ok(vec![Event::Expired { at: t(900) }])
    );
}

#[test]
fn an_order_cannot_expire_before_its_deadline() {
    assert_eq!(
        given(vec![placed()]).when(Command::Expire { at: t(899) }),
        Err(DomainError::NotYetExpired(t(900)))
    );
}

#[test]
fn a_payment_for_the_wrong_amount_or_currency_is_refunded_and_the_order_keeps_waiting() {
    let then = given(vec![placed()])
        .when(paid_with("p", 1999, "BRL"))
        .expect("decided");
    assert!(matches!(
        &then[..],
        [Event::RefundDecided {
            reason: RefundReason::AmountMismatch,
            amount_minor: 1999,
            ..
        }]
    ));
    let then = given(vec![placed()])
        .when(paid_with("p", 2000, "USD"))
        .expect("decided");
    assert!(matches!(
        &then[..],
        [Event::RefundDecided {
            reason: RefundReason::CurrencyMismatch,
            ..
        }]
    ));
    let order = fold(&[placed(), then[0].clone()]).expect("order");
    assert_eq!(order.state, OrderState::PaymentPending);
    assert_eq!(order.refunds.len(), 1);
}

#[test]
fn repeating_a_settlement_is_a_no_op_and_a_second_payment_is_refunded() {
    assert_eq!(
        given(vec![placed(), confirmed("p1")]).when(confirm("p1")),
        Ok(vec![])
    );
    assert_eq!(
        given(vec![placed(), confirmed("p1")]).when(confirm("p2")),
        Ok(vec![refund_decided("p2", RefundReason::SecondPayment)])
    );
    let failed = Event::PaymentFailed {
        payment_id: None,
        reason: "x".into(),
        at: t(1),
    };
    assert_eq!(given(vec![placed(), failed]).when(fail()), Ok(vec![]));
}

#[test]
fn a_late_payment_reclaims_an_expired_order_but_a_cancel_is_final() {
    let expired = Event::Expired { at: t(900) };
    let then = given(vec![placed(), expired.clone()])
        .when(confirm("p"))
        .expect("reclaimed");
    assert!(matches!(
        &then[..],
        [Event::Confirmed {
            reactivated: true,
            ..
        }]
    ));
    let gone = Command::Paid {
        fact: PaidFact {
            payment_id: "p".into(),
            amount_minor: 2000,
            currency: "BRL".into(),
            captured: true,
            at: t(10),
        },
        units_gone: true,
        holdings: vec![],
    };
    assert_eq!(
        given(vec![placed(), expired.clone()]).when(gone),
        Ok(vec![refund_decided("p", RefundReason::UnitsGone)])
    );
    // The buyer holds as many of B as allowed in orders since: no revival.
    let holding = |held| crate::limits::Holding {
        sku: Sku::parse("B").expect("sku"),
        limit: 2,
        held,
    };
    let over = |held| match confirm("p") {
        Command::Paid { fact, .. } => Command::Paid {
            fact,
            units_gone: false,
            holdings: vec![holding(held)],
        },
        other => other,
    };
    assert_eq!(
        given(vec![placed(), expired.clone()]).when(over(1)),
        Ok(vec![refund_decided("p", RefundReason::OverLimit)]),
        "2 of B again would make 3 of a limit of 2"
    );
    assert!(matches!(
        given(vec![placed(), expired.clone()])
            .when(over(0))
            .expect("decided")[..],
        [Event::Confirmed {
            reactivated: true,
            ..
        }]
    ));
    let cancelled = Event::Cancelled { at: t(3) };
    assert_eq!(
        given(vec![placed(), cancelled.clone()]).when(confirm("p")),
        Ok(vec![refund_decided("p", RefundReason::Cancelled)])
    );
    for ended in [expired, cancelled.clone()] {
        let history = vec![
            placed(),
            ended.clone(),
            refund_decided("p", RefundReason::Cancelled),
        ];
        let order = fold(&history).expect("order");
        assert_eq!(
            order.state,
            ended_state(&ended),
            "deciding a refund does not end the order yet"
        );
        let recorded = given(history.clone())
            .when(Command::RecordRefund {
                payment_id: "p".into(),
                at: t(20),
            })
            .expect("recorded");
        let order = fold(history.iter().chain(&recorded)).expect("order");
        assert_eq!(order.state, OrderState::Refunded);
        assert!(order.refunds[0].refunded);
        assert_eq!(order.payment.expect("payment").payment_id, "p");
    }
}

fn ended_state(e: &Event) -> OrderState {
    fold(&[placed(), e.clone()]).expect("order").state
}

#[test]
fn once_a_refund_is_decided_nothing_confirms_on_that_payment() {
    let history = vec![
        placed(),
        Event::Expired { at: t(900) },
        refund_decided("p", RefundReason::UnitsGone),
    ];
    // The units came back and the webhook is redelivered: still no confirmation.
    assert_eq!(given(history.clone()).when(confirm("p")), Ok(vec![]));
    let mismatched = vec![placed(), refund_decided("p", RefundReason::AmountMismatch)];
    assert_eq!(
        given(mismatched).when(confirm("p")),
        Ok(vec![]),
        "a pending order never confirms on a refunded payment"
    );
}

#[test]
fn a_refund_is_recorded_only_where_it_was_decided() {
    let confirmed_history = vec![placed(), confirmed("p1")];
    let record = |p: &str| Command::RecordRefund {
        payment_id: p.into(),
        at: t(20),
    };
    assert_eq!(
        given(confirmed_history.clone()).when(record("p1")),
        Err(DomainError::NoRefundDecided("p1".into()))
    );
    let with_second = vec![
        placed(),
        confirmed("p1"),
        refund_decided("p2", RefundReason::SecondPayment),
    ];
    let recorded = given(with_second.clone())
        .when(record("p2"))
        .expect("recorded");
    let order = fold(with_second.iter().chain(&recorded)).expect("order");
    assert_eq!(
        order.state,
        OrderState::Confirmed,
        "the order stays confirmed on its own payment"
    );
    assert_eq!(order.payment.expect("payment").payment_id, "p1");
    let again: Vec<Event> = with_second.into_iter().chain(recorded).collect();
    assert_eq!(given(again).when(record("p2")), Ok(vec![]));
}

#[test]
fn every_illegal_transition_is_an_error() {
    use OrderState::*;
    let ended = |e: Event| vec![placed(), e];
    let histories = [
        (Confirmed, ended(confirmed("p1"))),
        (
            PaymentFailed,
            ended(Event::PaymentFailed {
                payment_id: None,
                reason: "x".into(),
                at: t(1),
            }),
        ),
        (Cancelled, ended(Event::Cancelled { at: t(1) })),
        (Expired, ended(Event::Expired { at: t(900) })),
    ];
    for (state, history) in histories {
        assert_eq!(fold(&history).expect("order").state, state);
        for (action, cmd) in [
            ("cancel", Command::Cancel { at: t(1000) }),
            ("expire", Command::Expire { at: t(1000) }),
        ] {
            assert_eq!(
                given(history.clone()).when(cmd),
                Err(DomainError::IllegalTransition {
                    from: state,
                    action
                }),
                "{action} from {state}"
            );
        }
        if state != PaymentFailed {
            assert!(
                given(history.clone()).when(fail()).is_err(),
                "fail from {state}"
            );
        }
        if state != Expired {
            let then = given(history.clone()).when(confirm("p9")).expect("decided");
            assert!(
                matches!(&then[..], [Event::RefundDecided { .. }]),
                "a payment on a {state} order is refunded"
            );
        }
    }
    let refund = Command::RecordRefund {
        payment_id: "p".into(),
        at: t(1),
    };
    assert!(given(vec![placed()]).when(refund).is_err());
    assert_eq!(
        given(vec![]).when(Command::Cancel { at: t(1) }),
        Err(DomainError::NotFound)
    );
}

#[test]
fn events_round_trip_through_their_stored_parts() {
    for e in [
        placed(),
        confirmed("p"),
        Event::Expired { at: t(1) },
        refund_decided("p", RefundReason::Cancelled),
    ] {
        let back = Event::from_parts(e.type_name(), e.data()).expect("parse");
        assert_eq!(back, e);
    }
    assert_eq!(placed().movement(), Some(crate::Movement::Reserve));
    assert!(Event::from_parts("order.placed.v9", placed().data()).is_err());
}

#[test]
fn the_version_counts_events() {
    let order = fold(&[placed(), Event::Cancelled { at: t(2) }]).expect("order");
    assert_eq!(order.version, 2);
    assert_eq!(order.updated_at, t(2));
}

#[test]
fn an_authorization_confirms_and_is_captured_once_when_the_order_ships() {
    let confirmed = given(vec![placed()])
        .when(authorized("p1"))
        .expect("confirm");
    assert!(matches!(
        &confirmed[..],
        [Event::Confirmed {
            uncaptured: true,
            ..
        }]
    ));
    let mut history = vec![placed(), confirmed[0].clone()];
    let order = fold(&history).expect("order");
    assert_eq!(order.state, OrderState::Confirmed);
    assert_eq!(
        order.payment.as_ref().map(|p| p.capture),
        Some(Capture::Authorized)
    );
    // Recording a capture nobody decided is refused.
    let record = Command::RecordCapture {
        payment_id: "p1".into(),
        amount_minor: 2000,
        at: t(30),
    };
    assert_eq!(
        given(history.clone()).when(record.clone()),
        Err(DomainError::NoCaptureDecided("p1".into()))
    );
    let decide = Command::DecideCapture { at: t(20) };
    assert_eq!(
        given(history.clone()).when(decide.clone()),
        Ok(vec![capture_decided("p1")])
    );
    history.push(capture_decided("p1"));
    // Decided once: asking again decides nothing.
    assert_eq!(given(history.clone()).when(decide.clone()), Ok(vec![]));
    let captured = given(history.clone())
        .when(record.clone())
        .expect("captured");
    assert_eq!(
        captured,
        vec![Event::Captured {
            payment_id: "p1".into(),
            amount_minor: 2000,
            at: t(30)
        }]
    );
    history.extend(captured);
    assert_eq!(given(history.clone()).when(record), Ok(vec![]));
    assert_eq!(given(history.clone()).when(decide), Ok(vec![]));
    let order = fold(&history).expect("order");
    assert_eq!(order.payment.map(|p| p.capture), Some(Capture::Captured));
}

#[test]
fn a_payment_captured_at_once_needs_no_capture_and_a_pending_order_none_at_all() {
    let history = vec![placed(), confirmed("p1")];
    assert_eq!(
        given(history).when(Command::DecideCapture { at: t(20) }),
        Ok(vec![])
    );
    assert!(matches!(
        given(vec![placed()]).when(Command::DecideCapture { at: t(20) }),
        Err(DomainError::IllegalTransition { .. })
    ));
}

#[test]
fn an_authorization_that_cannot_settle_its_order_is_voided_and_the_order_keeps_its_state() {
    let history = vec![placed(), Event::Cancelled { at: t(5) }];
    let decided = given(history.clone()).when(authorized("p1")).expect("void");
    assert!(matches!(
        &decided[..],
        [Event::RefundDecided {
            void: true,
            reason: RefundReason::Cancelled,
            ..
        }]
    ));
    let mut history = [history, decided].concat();
    let voided = given(history.clone())
        .when(Command::RecordRefund {
            payment_id: "p1".into(),
            at: t(30),
        })
        .expect("voided");
    assert!(matches!(&voided[..], [Event::Refunded { void: true, .. }]));
    history.extend(voided);
    let order = fold(&history).expect("order");
    assert_eq!(
        order.state,
        OrderState::Cancelled,
        "a void took no money back"
    );
    assert!(order.payment.is_none());
    assert!(order.refunds.iter().all(|r| r.refunded && r.void));
}

fn refund_by(key: &str, amount_minor: i64) -> Command {
    Command::RefundByOperator {
        key: key.into(),
        amount_minor,
        at: t(40),
    }
}

#[test]
fn an_operator_refunds_once_per_key_and_never_more_than_was_taken() {
    let mut history = vec![placed(), confirmed("p1")];
    let decided = given(history.clone())
        .when(refund_by("t1", 1200))
        .expect("decided");
    assert!(matches!(
        &decided[..],
        [Event::OperatorRefundDecided {
            amount_minor: 1200,
            ..
        }]
    ));
    history.extend(decided);
    // Asked again with its key: nothing new; with its key for another amount: refused.
    assert_eq!(
        given(history.clone()).when(refund_by("t1", 1200)),
        Ok(vec![])
    );
    assert!(matches!(
        given(history.clone()).when(refund_by("t1", 1)),
        Err(DomainError::InvalidRefund(_))
    ));
    assert_eq!(
        given(history.clone()).when(refund_by("t2", 801)),
        Err(DomainError::RefundExceedsCaptured {
            asked: 801,
            left: 800
        })
    );
    assert!(matches!(
        given(history.clone()).when(refund_by("t2", 0)),
        Err(DomainError::InvalidRefund(_))
    ));
    let made = given(history.clone())
        .when(Command::RecordOperatorRefund {
            key: "t1".into(),
            at: t(50),
        })
        .expect("made");
    history.extend(made);
    let order = fold(&history).expect("order");
    assert_eq!(
        order.state,
        OrderState::Confirmed,
        "a refund keeps the order's state"
    );
    assert!(order.operator_refunds.iter().all(|r| r.refunded));
}

#[test]
fn nothing_is_refunded_before_an_authorization_is_captured_or_of_a_pending_order() {
    let authorized = given(vec![placed()])
        .when(authorized("p1"))
        .expect("confirm");
    let history = [vec![placed()], authorized].concat();
    assert_eq!(
        given(history).when(refund_by("t1", 100)),
        Err(DomainError::NothingCaptured)
    );
    assert!(matches!(
        given(vec![placed()]).when(refund_by("t1", 100)),
        Err(DomainError::IllegalTransition { .. })
    ));
}

#[test]
fn a_payment_awaiting_the_buyer_extends_the_reservation_once_and_bounded() {
    let wait = |p: &str, minutes: i64, at: i64| Command::AwaitAction {
        payment_id: p.into(),
        url: format!("https://psp.example/{p}/action"),
        extension: chrono::Duration::minutes(minutes),
        at: t(at),
    };
    // Placed at 0 with 900 s to pay; the challenge comes at 800 s.
    let decided = given(vec![placed()])
        .when(wait("p1", 10, 800))
        .expect("await");
    let [Event::ActionRequired { expires_at, .. }] = &decided[..] else {
        panic!("{decided:?}")
    };
    assert_eq!(*expires_at, t(800 + 600));
    let history = [vec![placed()], decided].concat();
    let order = fold(&history).expect("order");
    assert_eq!(
        (order.state, order.expires_at),
        (OrderState::PaymentPending, t(1400))
    );
    assert_eq!(
        order.next_action.map(|a| a.url),
        Some("https://psp.example/p1/action".to_owned())
    );
    // Once: a second challenge extends nothing; expiry waits for the new deadline.
    assert_eq!(
        given(history.clone()).when(wait("p2", 10, 1300)),
        Ok(vec![])
    );
    assert_eq!(
        given(history).when(Command::Expire { at: t(1000) }),
        Err(DomainError::NotYetExpired(t(1400)))
    );
    // Bounded: never more than an hour past the challenge.
    let long = given(vec![placed()])
        .when(wait("p1", 600, 100))
        .expect("await");
    assert!(
        matches!(&long[..], [Event::ActionRequired { expires_at, .. }] if *expires_at == t(100 + 3600))
    );
    // Nothing once the order is no longer pending.
    assert_eq!(
        given(vec![placed(), Event::Cancelled { at: t(5) }]).when(wait("p1", 10, 10)),
        Ok(vec![])
    );
}

fn cancel_by_operator(shipped: bool) -> Command {
    Command::CancelByOperator {
        shipped,
        reason: "warehouse lost it".into(),
        at: t(60),
    }
}

/// Applies `command` to `history`, which it extends with the events decided.
fn apply(history: &mut Vec<Event>, command: Command) -> Vec<Event> {
    let events = given(history.clone()).when(command).expect("decided");
    history.extend(events.clone());
    events
}

#[test]
fn an_operator_cancel_voids_an_authorization_and_gives_the_units_back_once() {
    let mut history = vec![placed()];
    apply(&mut history, authorized("p1"));
    let events = apply(&mut history, cancel_by_operator(false));
    let [cancelled, money] = &events[..] else {
        panic!("a cancel and its void: {events:?}")
    };
    assert_eq!(cancelled.movement(), Some(Movement::Restock));
    assert!(matches!(
        money,
        Event::OperatorRefundDecided { key, amount_minor: 2000, void: true, .. }
            if key == crate::operator::CANCEL_KEY
    ));
    let order = fold(&history).expect("order");
    assert_eq!(order.state, OrderState::Cancelled);
    assert_eq!(
        order.payment.as_ref().map(|p| p.capture),
        Some(Capture::Voided)
    );
    // Again: nothing; a capture or an operator refund of it: never.
    assert_eq!(
        given(history.clone()).when(cancel_by_operator(false)),
        Ok(vec![])
    );
    assert!(given(history.clone())
        .when(Command::DecideCapture { at: t(70) })
        .is_err());
    assert!(given(history.clone()).when(refund_by("t1", 1)).is_err());
    let voided = apply(
        &mut history,
        Command::RecordOperatorRefund {
            key: crate::operator::CANCEL_KEY.into(),
            at: t(70),
        },
    );
    assert!(matches!(
        &voided[..],
        [Event::OperatorRefunded { void: true, .. }]
    ));
}

#[test]
fn an_operator_cancel_refunds_what_earlier_refunds_left_and_nothing_of_a_free_order() {
    let mut history = vec![placed()];
    apply(&mut history, confirm("p1"));
    apply(&mut history, refund_by("t1", 500));
    let events = apply(&mut history, cancel_by_operator(false));
    assert!(matches!(
        &events[..],
        [
            Event::OperatorCancelled { .. },
            Event::OperatorRefundDecided {
                amount_minor: 1500,
                void: false,
                ..
            }
        ]
    ));
    // Everything refunded before: the cancel gives back nothing more.
    let mut history = vec![placed()];
    apply(&mut history, confirm("p1"));
    apply(&mut history, refund_by("t1", 2000));
    let events = apply(&mut history, cancel_by_operator(false));
    assert!(matches!(&events[..], [Event::OperatorCancelled { .. }]));
    // A key of soldonce's own is not an operator's to use.
    let history = vec![placed(), confirmed("p1")];
    assert!(matches!(
        given(history).when(refund_by(crate::operator::CANCEL_KEY, 1)),
        Err(DomainError::InvalidRefund(_))
    ));
}

#[test]
fn an_operator_cancel_is_refused_once_the_goods_left_and_gives_back_nothing_disputed() {
    let history = vec![placed(), confirmed("p1")];
    assert_eq!(
        given(history.clone()).when(cancel_by_operator(true)),
        Err(DomainError::GoodsLeft)
    );
    let mut shipped = vec![placed()];
    apply(&mut shipped, authorized("p1"));
    apply(&mut shipped, Command::DecideCapture { at: t(20) });
    assert_eq!(
        given(shipped).when(cancel_by_operator(false)),
        Err(DomainError::GoodsLeft),
        "a capture decided means the goods left"
    );
    let mut disputed = history.clone();
    apply(
        &mut disputed,
        Command::Dispute(DisputeFact {
            dispute_id: "dp1".into(),
            payment_id: "p1".into(),
            amount_minor: 2000,
            reason: "fraudulent".into(),
            at: t(30),
        }),
    );
    let events = given(disputed).when(cancel_by_operator(false));
    assert!(
        matches!(events.as_deref(), Ok([Event::OperatorCancelled { .. }])),
        "a disputed order still ends, giving back none of what the bank took: {events:?}"
    );
    // A pending order is cancelled as its buyer would; an ended one not at all.
    assert_eq!(
        given(vec![placed()]).when(cancel_by_operator(false)),
        Ok(vec![Event::Cancelled { at: t(60) }])
    );
    assert!(matches!(
        given(vec![placed(), Event::Expired { at: t(900) }]).when(cancel_by_operator(false)),
        Err(DomainError::IllegalTransition { .. })
    ));
    let long = Command::CancelByOperator {
        shipped: false,
        reason: "x".repeat(201),
        at: t(60),
    };
    assert!(matches!(
        given(history).when(long),
        Err(DomainError::InvalidCancel(_))
    ));
}

#[test]
fn an_abandoned_challenge_expires_the_order_and_a_decline_fails_it() {
    let awaiting = vec![
        placed(),
        Event::ActionRequired {
            payment_id: "p1".into(),
            url: "https://psp/3ds/p1".into(),
            expires_at: t(1500),
            at: t(5),
        },
    ];
    let gave_up = |payment: &str, abandoned| Command::FailPayment {
        payment_id: Some(payment.into()),
        reason: "canceled (abandoned)".into(),
        abandoned,
        at: t(20),
    };
    assert_eq!(
        given(awaiting.clone()).when(gave_up("p1", true)),
        Ok(vec![Event::Expired { at: t(20) }]),
        "ends like any unpaid order, before its extended deadline"
    );
    assert!(matches!(
        given(awaiting.clone())
            .when(gave_up("p1", false))
            .expect("decided")[..],
        [Event::PaymentFailed { .. }]
    ));
    // Another payment's abandonment, or one of an order not waiting: a decline.
    assert!(matches!(
        given(awaiting).when(gave_up("p2", true)).expect("decided")[..],
        [Event::PaymentFailed { .. }]
    ));
    assert!(matches!(
        given(vec![placed()])
            .when(gave_up("p1", true))
            .expect("decided")[..],
        [Event::PaymentFailed { .. }]
    ));
}
