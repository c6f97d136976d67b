/*
 * soldonce's money-and-stock protocol, model-checked with Spin.
 *
 * What is modelled (the code it stands for in brackets):
 *   - buyers reserve a unit or are refused              [store::placing]
 *   - the payment worker checks the order, then charges  [payment-worker]
 *     (a gap between the two: a cancel or an expiry can land in it)
 *   - the PSP answers authorized (requires_capture),    [psp-sim]
 *     failed, processing, or requires_action (3-D
 *     Secure: the buyer completes it, authorized, or
 *     abandons it, canceled); processing settles later;
 *     a buyer may pay twice
 *   - every fact the PSP gives (worker reply, webhook,   [store::payments::learn
 *     lookup by key, reconciliation) may be lost,         + domain::payment::decide_paid]
 *     duplicated and delivered in any order; each is
 *     learned by one path in one transaction
 *   - cancel and expire a pending order                  [checkout, expiry]
 *   - an expired order paid late reclaims its units if
 *     they are still there, else the payment is refunded
 *   - compensation carries out every refund owed,        [payment-worker compensate]
 *     idempotently (a crash before it is recorded
 *     repeats it with the same key): an authorization
 *     is voided, money taken is refunded
 *   - a confirmed order ships unless a dispute holds     [fulfillment, store::shipments,
 *     it; its capture is decided once and carried out     store::captures,
 *     on the payment it stands on                         payment-worker capture]
 *   - an operator cancels a confirmed order before its   [store::operator_cancels,
 *     goods leave: the unit back on sale, the shipment     payment-worker operator_refund]
 *     stopped, its holds released, the authorization
 *     voided or the money taken refunded, once, unless
 *     a dispute of that payment is recorded (then
 *     nothing: the bank's to settle)
 *   - reconciliation re-learns every payment the PSP     [reconcile]
 *     holds, once mid-run and once at the end (with
 *     DISPUTES: at any moment, again and again, and it
 *     records every dispute the PSP lists on a payment
 *     of soldonce's that no webhook recorded)
 *   - DISPUTES (a second run): each charge asks for      [store::disputes, findings]
 *     either capture method; the buyer's bank disputes
 *     money taken (any payment, once: both of one
 *     order too), the PSP reports it (dispute.created,
 *     late or before the payment itself); soldonce
 *     records it on the order (its webhook, else
 *     reconciliation), and each dispute recorded before
 *     the shipment shipped holds it with a hold of its
 *     own; a person acknowledges the finding, releasing
 *     that dispute's hold or not; operators refund and
 *     cancel
 * A crash between steps is a step that never happens or a message that is
 * lost: every transaction here is one atomic step, as the database makes it.
 *
 * Checked after every step: units are conserved, never negative,
 * sold = confirmed orders, and a confirmed (or operator-cancelled) order has
 * exactly one payment attached; a capture is only ever of an attached
 * payment with no void decided and a void only of one decided for a refund
 * or of a cancelled order's uncaptured authorization, so no payment is both
 * captured and voided; a shipment ships only if no hold of its order
 * stands, no dispute recorded before it shipped is unreleased by a person
 * (whatever became of another dispute's hold), and its order was not
 * cancelled.
 * Checked once nothing can move: no order is left pending and no payment
 * processing or awaiting the buyer; then, after a last reconciliation,
 * shipment, capture and compensation pass (the real system runs them
 * forever), every capture decided was made, every authorization has ended
 * (captured or voided), a confirmed order has its one payment captured and
 * not refunded unless an operator refunded it — money taken = captured −
 * refunded — and its goods left, an operator-cancelled order's goods never
 * left and its money was given back (or its payment's dispute is recorded),
 * no other order keeps any money, a refund the PSP refused is only of
 * money the bank took back, and every dispute is recorded on its order.
 * So every order ends, a held one too: "nothing can move" includes a
 * person releasing a finding and an operator cancelling a held order (the
 * model proves one of them can always end it, not that a person does). A
 * dispute decides no money: recording it changes only dispute variables.
 *
 * NAIVE_WEBHOOK is the webhook path before payments were reconciled: a
 * success for an order that is no longer pending is acknowledged and
 * forgotten. UNDO_CANCEL confirms a late payment whatever became of the
 * order. NO_EXPIRY runs no expiry, so a charge whose answer is lost leaves
 * its order pending for ever. REFUND_NOT_VOID compensates an authorization
 * with a refund, which the PSP refuses (nothing was captured), so the
 * authorization never ends. CANCEL_AFTER_SHIPPING lets an operator cancel
 * whatever became of the goods: an order ships and is cancelled. With
 * DISPUTES, HOLD_NOT_RECHECKED is advance_due trusting its first snapshot:
 * a hold committed after it is not seen. All six must fail: see
 * tests/model.
 *
 * EVERY_DISPUTE_HOLDS, with DISPUTES, is a stronger promise the protocol
 * does not make (not run by tests/model): a dispute soldonce hears of
 * before the goods leave holds them. It fails: a dispute.created that
 * arrives before its payment was learned is a receipt only; the payment is
 * then learned (by its fact, or by reconciliation, which records the
 * dispute in a later transaction), its order confirmed and shipped, and
 * reconciliation records the dispute after: a finding, no hold. Such a
 * dispute holds the goods only if a walk records it before they ship.
 */

#define N      2            /* orders */
#define UNITS  1            /* stock of the one SKU */
#define P      (2 * N)      /* payments: 2i is the worker's for order i, 2i+1 a second one */
#define ORD(p) ((p) / 2)
#ifdef DISPUTES
#define MAXMSG 1            /* see DISPUTES below */
#else
#define MAXMSG 2            /* copies of one fact in flight at once */
#endif

/* The default run takes money at shipment (CAPTURE_AT=shipment) throughout.
   DISPUTES is a second run where each charge asks for either capture
   method (CAPTURE_AT may change while orders are in flight: each payment
   follows its own), so money may be taken before the goods leave and the
   buyer's bank may dispute it, and operators also refund. Reconciliation
   runs at any moment, as often as it likes, and records disputes. To stay
   small it leaves out what the default run covers: processing and 3-D
   Secure answers, resent webhooks and duplicated facts. Without processing
   and 3-D Secure, the first delivery of a payment's one fact decides all
   it ever will (confirms, fails or refunds, or is a no-op for good), so a
   second copy would only be a no-op step. Every payment may be disputed,
   once: the two of order 0 both, so one shipment may have two holds. */
#ifdef DISPUTES
#ifndef MAXDISPUTES
#define MAXDISPUTES P       /* disputes opened in one run: any payment's */
#endif
#else
#define MAXDISPUTES 0
#endif

mtype = { NONE, PENDING, CONFIRMED, FAILED, CANCELLED, EXPIRED, REJECTED };
mtype = { UNDECIDED, ATTACHED, REFUND };
mtype = { NOPAY, PROC, ACTION, AUTH, CAPT, VOIDED, DECLINED };
mtype = { NOSHIP, SHIPPED, STOPPED };  /* shipment: none, pending or picked; shipped or delivered; cancelled */
mtype = { NOOP, VOID_OWED, REFUND_OWED, OP_DONE, OP_REFUSED };  /* an operator refund (or void) */

mtype state[N] = NONE;
byte available = UNITS;
byte reserved = 0;
byte sold = 0;

mtype psp[P] = NOPAY;       /* the PSP's books */
bool atonce[P];             /* charged with capture_method automatic: it succeeds captured */
bool refunded[P];
bool disputed[P];           /* the buyer's bank took it back */
mtype ship[N] = NOSHIP;     /* the order's shipment */
bool capture_owed[P];       /* a capture decided: order.capture_decided */
mtype disp[P] = UNDECIDED;  /* soldonce's decision on each payment */
byte inflight[P];           /* facts about payment p on their way to soldonce */
bool opcancelled[N];        /* an operator cancelled the confirmed order */
mtype opmoney[P] = NOOP;    /* the operator refund or void decided on payment p */
bool refused[P];            /* the PSP refused a refund soldonce asked: set aside for a person */

byte disputes = 0;          /* disputes opened at the PSP */
bool dispute_sent[P];       /* dispute.created on its way to soldonce */
byte finding[P];            /* the dispute of p recorded on its order: 0 not (yet),
                               1 open, 2 acknowledged (its hold stays), 3 released */
bool hold[P];               /* shipment_holds (order ORD(p), the dispute of p): in place */
bool stop[P];               /* the dispute of p reached soldonce before its order's
                               goods left, and no person released it: they must not leave */

#define CONF(i) (state[i] == CONFIRMED -> 1 : 0)
#define OPC(i)  (opcancelled[i] -> 1 : 0)
#define ATT(p)  (disp[p] == ATTACHED -> 1 : 0)
#define PAID(p) (psp[p] == AUTH || psp[p] == CAPT)   /* confirms: held or taken */
#define OK(p)   (atonce[p] -> CAPT : AUTH)           /* what a success is */
#define STANDING(p) (psp[p] == CAPT && !refunded[p]) /* captured, not refunded by soldonce */
#define KEPT(p) (STANDING(p) && !disputed[p])        /* ... nor taken back by the bank */
#define ATTACHED_OF(i) (disp[2 * (i)] == ATTACHED -> 2 * (i) : 2 * (i) + 1)
#define UNSHIPPED(i) (ship[i] == NOSHIP)
/* advance_due looks at shipments only, never at their orders: a shipment
   stays shippable after its order's cancel unless the cancel stops it */
#define SHIPPABLE(i) ((state[i] == CONFIRMED || opcancelled[i]) && ship[i] == NOSHIP)
/* orders.capture = 'authorized': confirmed on an authorization, no capture decided */
#define AUTHORIZED(q) (disp[q] == ATTACHED && !atonce[q] && !capture_owed[q])
/* advance_due: no hold of the order's shipment stands */
#define HELD(i) (hold[2 * (i)] || hold[2 * (i) + 1])

/* The capture method a charge asks for. */
#ifdef DISPUTES
#define MODE(p) if :: skip :: atonce[p] = true fi
#else
#define MODE(p) skip
#endif

/* What holds in every reachable state: checked after every step that moves
   stock or decides a payment. */
inline check() {
    assert(available + reserved + sold == UNITS);
    assert(sold == CONF(0) + CONF(1));
    assert(CONF(0) + OPC(0) == ATT(0) + ATT(1));
    assert(CONF(1) + OPC(1) == ATT(2) + ATT(3))
}

/* Sends 0 (lost), 1 or 2 (duplicated) copies of a fact about p. */
inline tell(p) {
    if
    :: skip
    :: inflight[p] < MAXMSG -> inflight[p]++
    :: inflight[p] + 1 < MAXMSG -> inflight[p] = inflight[p] + 2
    fi
}

inline release(i) {
    reserved--;
    available++
}

/* One fact learned in one transaction: the PSP's word on payment p. */
inline learn(p) {
    i = ORD(p);
    if
    :: PAID(p) && disp[p] == UNDECIDED ->
#ifdef NAIVE_WEBHOOK
        if
        :: state[i] == PENDING -> state[i] = CONFIRMED; reserved--; sold++; disp[p] = ATTACHED;
            printf("MSC: payment %d learned: order %d confirmed\n", p, i)
        :: else -> printf("MSC: payment %d learned: order %d no longer pending, acknowledged and forgotten\n", p, i)
        fi
#else
#ifdef UNDO_CANCEL
        if
        :: state[i] == PENDING -> state[i] = CONFIRMED; reserved--; sold++; disp[p] = ATTACHED
        :: (state[i] == CANCELLED || state[i] == EXPIRED) -> state[i] = CONFIRMED; sold++; disp[p] = ATTACHED;
            printf("MSC: payment %d learned: ended order %d confirmed again\n", p, i)
        :: else -> disp[p] = REFUND
        fi
#else
        if
        :: state[i] == PENDING ->
            state[i] = CONFIRMED; reserved--; sold++; disp[p] = ATTACHED;
            printf("MSC: payment %d learned: order %d confirmed\n", p, i)
        :: state[i] == EXPIRED && available > 0 ->   /* reclaimed */
            state[i] = CONFIRMED; available--; sold++; disp[p] = ATTACHED;
            printf("MSC: payment %d learned: expired order %d reclaims its unit\n", p, i)
        :: state[i] == EXPIRED && available == 0 -> disp[p] = REFUND;   /* units gone */
            printf("MSC: payment %d learned: units gone, refund owed\n", p)
        :: else -> disp[p] = REFUND;  /* cancelled, declined, confirmed on another, no such order */
            printf("MSC: payment %d learned: refund owed\n", p)
        fi
#endif
#endif
    :: (psp[p] == DECLINED || psp[p] == VOIDED) && disp[p] == UNDECIDED && state[i] == PENDING ->
        state[i] = FAILED; release(i);
        printf("MSC: payment %d learned: %e, order %d failed\n", p, psp[p], i)
    :: else -> skip     /* decided before, processing, or a decline that no longer applies */
    fi;
    check();
    i = 0
}

proctype buyer(byte i) {
    atomic {
        if
        :: available > 0 -> available--; reserved++; state[i] = PENDING;
            printf("MSC: order %d reserves the unit (202)\n", i)
        :: else -> state[i] = REJECTED;
            printf("MSC: order %d refused (409)\n", i)
        fi;
        check()
    }
}

proctype worker(byte i) {
    state[i] != NONE;
    if
    :: state[i] == PENDING -> skip
    :: else -> goto done
    fi;
    /* the gap: the order may end here */
    atomic {
        if
        :: psp[2 * i] == NOPAY ->
            MODE(2 * i);
            if
            :: psp[2 * i] = OK(2 * i)
            :: psp[2 * i] = DECLINED
#ifndef DISPUTES
            :: psp[2 * i] = PROC
            :: psp[2 * i] = ACTION
#endif
            fi;
            printf("MSC: worker charges order %d: payment %d is %e\n", i, 2 * i, psp[2 * i])
        :: else -> skip     /* same key: the same payment */
        fi;
        tell(2 * i)         /* the reply, or nothing if it was lost */
    }
done:
    skip
}

/* The buyer pays a second time (or the PSP holds a charge soldonce never asked for). */
proctype second_payment(byte i) {
    state[i] != NONE;
    atomic {
        MODE(2 * i + 1);
        psp[2 * i + 1] = OK(2 * i + 1);
        printf("MSC: order %d paid a second time: payment %d\n", i, 2 * i + 1);
        tell(2 * i + 1)
    }
}

byte resent = 0;    /* webhooks sent again after their first attempt */

/* One step per payment: the guard comes first, so a process with nothing
   to do is blocked at the top of its loop (a valid end state). */
#ifdef DISPUTES
#define RESENDS 0
#else
#define RESENDS 1
#endif
#define SETTLE(q) \
    :: atomic { psp[q] == PROC -> if :: psp[q] = OK(q) :: psp[q] = DECLINED fi; \
        printf("MSC: payment %d settles: %e\n", q, psp[q]); tell(q) } \
    :: atomic { psp[q] == ACTION -> if :: psp[q] = OK(q) :: psp[q] = VOIDED fi; \
        printf("MSC: the buyer acts on payment %d: %e\n", q, psp[q]); tell(q) } \
    :: atomic { (psp[q] == OK(q) || psp[q] == DECLINED || psp[q] == VOIDED) && resent < RESENDS -> resent++; tell(q) } \
    :: atomic { STANDING(q) && !disputed[q] && disputes < MAXDISPUTES -> disputes++; disputed[q] = true; \
        printf("MSC: the buyer's bank disputes payment %d\n", q); dispute_sent[q] = true }

proctype psp_settles() {
end:
    do
    SETTLE(0)
    SETTLE(1)
    SETTLE(2)
    SETTLE(3)
    od
}

#define LEARN(q) :: atomic { inflight[q] > 0 -> inflight[q]--; learn(q) } \
    :: atomic { dispute_sent[q] -> dispute_sent[q] = false; record_dispute(q) }

/* A dispute recorded [store::disputes::record], in the transaction of
   dispute.created's webhook or of reconciliation: the order holding the
   payment (a payments row: soldonce learned it), its row locked, then its
   shipment's; recorded once per dispute id (again, a no-op), a hold of its
   own if the shipment has not shipped (none, pending or picked: not
   shipped, delivered or cancelled), a finding. It decides no money: only
   dispute variables change. */
inline record_dispute(q) {
    i = ORD(q);
    if
    :: disp[q] == UNDECIDED ->
#ifdef EVERY_DISPUTE_HOLDS
        stop[q] = UNSHIPPED(i);
#endif
        printf("MSC: dispute of payment %d: no order holds it yet, receipt only\n", q)
    :: disp[q] != UNDECIDED && finding[q] != 0 ->
        printf("MSC: dispute of payment %d recorded before: nothing more\n", q)
    :: else ->
        finding[q] = 1;
        if
        :: UNSHIPPED(i) -> hold[q] = true; stop[q] = true;
            printf("MSC: dispute of payment %d recorded on order %d: shipment held\n", q, i)
        :: else -> printf("MSC: dispute of payment %d recorded on order %d: shipment %e, not held\n", q, i, ship[i])
        fi
    fi;
    i = 0
}

/* Reconciliation [payment-worker reconcile]. With DISPUTES it runs at any
   moment, again and again (it runs periodically): each step is one
   transaction of a walk, learning a payment no fact taught soldonce, or
   recording a dispute the PSP lists on a payment soldonce holds and no
   webhook recorded (as the webhook would: a hold only if the shipment has
   not shipped yet). A walk reads the PSP's listing before it records, but
   a dispute listed then is there still, so recording at the step reads
   no more than some later walk would. It learns a payment only while no
   fact of it is on its way, and records a dispute only while no
   dispute.created is: else the learner can take the very same step now
   (the copy left over is then a no-op), so no outcome is lost and the
   search stays small. */
#define LEARNS(q) (disp[q] == UNDECIDED && (PAID(q) \
    || ((psp[q] == DECLINED || psp[q] == VOIDED) && state[ORD(q)] == PENDING)))
#define RECONCILE(q) \
    :: atomic { LEARNS(q) && inflight[q] == 0 -> printf("MSC: reconciliation learns payment %d\n", q); learn(q) } \
    :: atomic { disputed[q] && disp[q] != UNDECIDED && finding[q] == 0 && !dispute_sent[q] -> \
        printf("MSC: reconciliation finds the dispute of payment %d\n", q); record_dispute(q) }

proctype reconciliation() {
    byte i;
end:
    do
    RECONCILE(0)
    RECONCILE(1)
    RECONCILE(2)
    RECONCILE(3)
    od
}

proctype learner() {
    byte i;
end:
    do
    LEARN(0)
    LEARN(1)
    LEARN(2)
    LEARN(3)
    od
}

proctype cancel_or_expire(byte i) {
end:
    atomic {
        state[i] == PENDING ->
        if
        :: state[i] = CANCELLED
        :: state[i] = EXPIRED
        fi;
        printf("MSC: order %d %e, its unit released\n", i, state[i]);
        release(i);
        check()
    }
}

/* A compensation: money taken is refunded, an authorization voided. The
   PSP refuses a refund of what it never captured (REFUND_NOT_VOID). */
inline compensate(q) {
    if
    :: psp[q] == CAPT && !refunded[q] && !disputed[q] -> refunded[q] = true;
        printf("MSC: payment %d refunded at the PSP\n", q)
    :: psp[q] == CAPT && !refunded[q] && disputed[q] -> refused[q] = true;   /* nothing left to refund */
        printf("MSC: payment %d: refund refused, the bank took it back\n", q)
#ifdef REFUND_NOT_VOID
    :: psp[q] == AUTH -> printf("MSC: payment %d: a refund of an authorization, refused\n", q)
#else
    :: psp[q] == AUTH -> assert(disp[q] == REFUND); psp[q] = VOIDED;
        printf("MSC: payment %d voided at the PSP\n", q)
#endif
    :: else -> skip
    fi
}

#define REFUND_AT_PSP(q) :: atomic { disp[q] == REFUND && ((STANDING(q) && !refused[q]) || psp[q] == AUTH) -> compensate(q) } \
    :: atomic { opmoney[q] == VOID_OWED -> op_void(q) } \
    :: atomic { opmoney[q] == REFUND_OWED -> op_refund(q) }

/* An operator refund carried out [payment-worker operator_refund]: a void
   (void:<payment_id>) of an authorization; a refund of money taken. */
inline op_void(q) {
    assert(psp[q] != CAPT);     /* captured before its void */
    if
    :: psp[q] == AUTH -> psp[q] = VOIDED;
        printf("MSC: payment %d voided at the PSP (operator cancel)\n", q)
    :: else -> skip             /* voided already */
    fi;
    opmoney[q] = OP_DONE
}

inline op_refund(q) {
    if
    :: STANDING(q) && !disputed[q] -> refunded[q] = true; opmoney[q] = OP_DONE;
        printf("MSC: payment %d refunded at the PSP (operator)\n", q)
    :: else -> assert(psp[q] == CAPT && disputed[q]); refused[q] = true; opmoney[q] = OP_REFUSED;
        printf("MSC: payment %d: operator refund refused, the bank took it back\n", q)
    fi
}

proctype compensation() {
end:
    do
    REFUND_AT_PSP(0)
    REFUND_AT_PSP(1)
    REFUND_AT_PSP(2)
    REFUND_AT_PSP(3)
    od
}

/* Fulfillment [store::shipments, store::captures]: a confirmed order gets
   a shipment (its row share-locked: only a confirmed one), which advance_due
   moves on unless a hold of its order stands or it was cancelled; once it
   shipped, the capture sweep decides the capture of the order's
   authorization. Here
   "none", "pending" and "picked" are one state (NOSHIP): every guard
   treats them alike (a hold, a cancel); an order cancelled before
   fulfillment made its shipment never gets one, so it is STOPPED too.
   advance_due reads shipments, not orders: a cancelled order's shipment
   would move on unless the cancel stopped it (SHIPPABLE). The sweep's
   decision is part of the shipping step: between the two nothing can
   cancel the order (it shipped) and only the capture waits for it.
   advance_due selects its rows (state <> 'cancelled', no hold standing)
   in one snapshot, locks them (PostgreSQL re-reads a row changed
   meanwhile) and looks for holds again: so it is one atomic step, unless
   HOLD_NOT_RECHECKED, where a hold is only seen in the first snapshot. */
inline advance(i) {
    ship[i] = SHIPPED;
    printf("MSC: order %d's shipment ships\n", i);
    assert(!hold[2 * i] && !hold[2 * i + 1]);
    assert(!opcancelled[i]);
    assert(!stop[2 * i] && !stop[2 * i + 1]);
    q = ATTACHED_OF(i);
    if
    :: AUTHORIZED(q) -> capture_owed[q] = true;
        printf("MSC: order %d's capture is decided\n", i)
    :: else -> skip
    fi
}

proctype fulfillment(byte i) {
    byte q;
#ifdef HOLD_NOT_RECHECKED
    bool due;
end:
    do
    :: atomic { SHIPPABLE(i) && !HELD(i) && !due -> due = true;
        printf("MSC: advance_due selects order %d's shipment: no hold in its snapshot\n", i) }
    :: atomic { due -> due = false;
        if
        :: SHIPPABLE(i) -> advance(i)
        :: else -> skip
        fi }
    od
#else
end:
    atomic { SHIPPABLE(i) && !HELD(i) -> advance(i) }
#endif
}

/* An operator cancels a confirmed order [store::operator_cancels,
   domain::operator::decide_cancel]: its row locked, then its shipment's;
   refused (nothing changes, so not modelled) once its goods left (shipped,
   or a capture decided), disputed or not. Else, at once: cancelled, the
   unit back on sale, the shipment (if any) cancelled, every hold of the
   order released (moot: the shipment never moves; the findings stay open),
   and the money decided back once: a void of an authorization, a refund of
   money taken at once (none if operator refunds took it all), and nothing
   if a dispute of that payment is recorded (the bank's to settle; a
   dispute of another payment changes nothing here). Again, it changes
   nothing. */
#ifdef CANCEL_AFTER_SHIPPING
#define MAY_CANCEL(i) (state[i] == CONFIRMED)
#else
#define MAY_CANCEL(i) (state[i] == CONFIRMED && ship[i] != SHIPPED \
    && !capture_owed[ATTACHED_OF(i)])
#endif

inline op_cancel(i) {
    q = ATTACHED_OF(i);
    state[i] = CANCELLED; opcancelled[i] = true;
    sold--; available++;
    if
    :: ship[i] == NOSHIP -> ship[i] = STOPPED
    :: else -> skip     /* it left: a shipment that shipped is never cancelled */
    fi;
    hold[2 * i] = false; hold[2 * i + 1] = false;
    if
    :: finding[q] != 0 -> skip  /* its payment's dispute is recorded */
    :: finding[q] == 0 && !atonce[q] -> opmoney[q] = VOID_OWED
    :: finding[q] == 0 && atonce[q] && opmoney[q] == NOOP -> opmoney[q] = REFUND_OWED
    :: else -> skip
    fi;
    printf("MSC: an operator cancels order %d: unit back, %e\n", i, opmoney[q]);
    check()
}

/* An operator refunds all a confirmed order's payment took (DISPUTES). */
#define MAY_REFUND(i) (state[i] == CONFIRMED && psp[ATTACHED_OF(i)] == CAPT \
    && (atonce[ATTACHED_OF(i)] || capture_owed[ATTACHED_OF(i)]) && opmoney[ATTACHED_OF(i)] == NOOP)

inline op_ask_refund(i) {
    opmoney[ATTACHED_OF(i)] = REFUND_OWED;
    printf("MSC: an operator refunds order %d\n", i)
}

/* A person acknowledges the finding of the dispute of q (soldonce findings
   ack) and leaves its hold in place for good, or releases that dispute's
   hold, and only it (--release, then or later: at any moment). */
inline release_hold(q) {
    finding[q] = 3;
    hold[q] = false;
    stop[q] = false;
    printf("MSC: a person releases the finding of payment %d's dispute\n", q)
}

#define PERSON(q) \
    :: atomic { finding[q] == 1 -> finding[q] = 2; \
        printf("MSC: a person acknowledges the finding of payment %d's dispute\n", q) } \
    :: atomic { finding[q] == 1 -> release_hold(q) }

proctype operator() {
    byte q;
end:
    do
    :: atomic { MAY_CANCEL(0) -> op_cancel(0) }
    :: atomic { MAY_CANCEL(1) -> op_cancel(1) }
#ifdef DISPUTES
    :: atomic { MAY_REFUND(0) -> op_ask_refund(0) }
    :: atomic { MAY_REFUND(1) -> op_ask_refund(1) }
#endif
    PERSON(0)
    PERSON(1)
    PERSON(2)
    PERSON(3)
    od
}

/* Carries out a decided capture, once: only ever of the attached payment. */
inline capture(q) {
    assert(disp[q] == ATTACHED && opmoney[q] == NOOP);
    psp[q] = CAPT;
    printf("MSC: payment %d captured\n", q)
}

#define CAPTURE_AT_PSP(q) :: atomic { capture_owed[q] && psp[q] == AUTH -> capture(q) }

proctype capturer() {
end:
    do
    CAPTURE_AT_PSP(0)
    CAPTURE_AT_PSP(1)
    CAPTURE_AT_PSP(2)
    CAPTURE_AT_PSP(3)
    od
}

proctype reconcile_once() {
    byte p, i;
    for (p : 0 .. P - 1) {
        atomic { learn(p) }
    }
}

init {
    byte i, p, q;
    atomic {
        for (i : 0 .. N - 1) {
            run buyer(i);
            run worker(i);
            run fulfillment(i);
#ifndef NO_EXPIRY
            run cancel_or_expire(i)
#endif
        }
        run second_payment(0);
        run psp_settles();
        run learner();
        run compensation();
        run capturer();
        run operator();
#ifdef DISPUTES
        run reconciliation()
#else
        run reconcile_once()
#endif
    }
    timeout;
    /* Nothing can move any more. Expiry is enabled for every pending order
       and the PSP settles every processing payment, so none may be left:
       that is "every order ends". Then what runs forever in the real system
       runs once more: reconciliation re-learns every payment, fulfillment
       ships and decides captures, compensation refunds what is owed (with
       DISPUTES reconciliation has nothing left: it could move). A held
       shipment stays held, but nothing can move only once no confirmed
       order is held: an operator's cancel is enabled for every one. */
    atomic {
        for (i : 0 .. N - 1) {
            assert(state[i] != PENDING)
        }
        for (p : 0 .. P - 1) {
            assert(psp[p] != PROC && psp[p] != ACTION)
        }
        for (p : 0 .. P - 1) {
            learn(p)
        }
        for (i : 0 .. N - 1) {
            if
            :: SHIPPABLE(i) && !HELD(i) -> advance(i)
            :: else -> skip
            fi
        }
        for (p : 0 .. P - 1) {
            if
            :: disp[p] == REFUND && !refused[p] -> compensate(p)
            :: capture_owed[p] && psp[p] == AUTH -> capture(p)
            :: opmoney[p] == VOID_OWED -> op_void(p)
            :: opmoney[p] == REFUND_OWED -> op_refund(p)
            :: else -> skip
            fi
        }
        for (p : 0 .. P - 1) {
            i = ORD(p);
            /* every authorization ended: captured (its order shipped) or voided */
            assert(psp[p] != AUTH);
            /* soldonce keeps only the money of confirmed orders */
            assert(!KEPT(p) || (disp[p] == ATTACHED && state[i] == CONFIRMED));
            /* a capture decided was made; a void only of an authorization given back */
            assert(!capture_owed[p] || psp[p] == CAPT);
            assert(psp[p] != VOIDED || disp[p] != ATTACHED || opcancelled[i]);
            /* a refund refused only of money the bank took back */
            assert(!refused[p] || disputed[p]);
            /* every dispute recorded on its order (by its webhook or by
               reconciliation), whatever the order of the facts */
            assert(!disputed[p] || finding[p] != 0)
        }
        for (i : 0 .. N - 1) {
            q = ATTACHED_OF(i);
            if
            :: state[i] == CONFIRMED ->
                /* its money is taken, and given back only by an operator */
                assert(psp[q] == CAPT && (refunded[q] || refused[q]) == (opmoney[q] != NOOP));
                /* its goods left */
                assert(ship[i] == SHIPPED)
            :: opcancelled[i] ->
                /* nothing kept, nothing left open, the goods never left;
                   a disputed payment's money is the bank's to settle */
                assert(opmoney[q] == OP_DONE || opmoney[q] == OP_REFUSED
                    || (opmoney[q] == NOOP && finding[q] != 0 && disputed[q]));
                assert(!STANDING(q) || disputed[q]);
                assert(ship[i] != SHIPPED)
            :: else ->
                assert(ship[i] == NOSHIP)
            fi
        }
    }
}
