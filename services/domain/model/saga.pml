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
 *   - a confirmed order ships; its capture is decided     [fulfillment, store::captures]
 *     once and carried out on the payment it stands on   [payment-worker capture]
 *   - reconciliation re-learns every payment the PSP     [reconcile]
 *     holds, once mid-run and once at the end
 * A crash between steps is a step that never happens or a message that is
 * lost: every transaction here is one atomic step, as the database makes it.
 *
 * Checked after every step: units are conserved, never negative,
 * sold = confirmed orders, and a confirmed order has exactly one payment
 * attached; a capture is only ever of an attached payment and a void only
 * of one decided for a refund, so no payment is both captured and voided.
 * Checked once nothing can move: no order is left pending and no payment
 * processing or awaiting the buyer; then, after a last reconciliation,
 * shipment, capture and compensation pass (the real system runs them
 * forever), every authorization has ended (captured or voided), a confirmed
 * order has exactly its one payment standing at the PSP — captured, not
 * refunded: money taken = captured − refunded — and no other order has any.
 *
 * NAIVE_WEBHOOK is the webhook path before payments were reconciled: a
 * success for an order that is no longer pending is acknowledged and
 * forgotten. UNDO_CANCEL confirms a late payment whatever became of the
 * order. NO_EXPIRY runs no expiry, so a charge whose answer is lost leaves
 * its order pending for ever. REFUND_NOT_VOID compensates an authorization
 * with a refund, which the PSP refuses (nothing was captured), so the
 * authorization never ends. All four must fail: see tests/model.
 */

#define N      2            /* orders */
#define UNITS  1            /* stock of the one SKU */
#define P      (2 * N)      /* payments: 2i is the worker's for order i, 2i+1 a second one */
#define ORD(p) ((p) / 2)
#define MAXMSG 2            /* copies of one fact in flight at once */

mtype = { NONE, PENDING, CONFIRMED, FAILED, CANCELLED, EXPIRED, REJECTED };
mtype = { UNDECIDED, ATTACHED, REFUND };
mtype = { NOPAY, PROC, ACTION, AUTH, CAPT, VOIDED, DECLINED };

mtype state[N] = NONE;
byte available = UNITS;
byte reserved = 0;
byte sold = 0;

mtype psp[P] = NOPAY;       /* the PSP's books */
bool refunded[P];
bool shipped[N];            /* the order's goods left */
bool capture_owed[P];       /* a capture decided: order.capture_decided */
mtype disp[P] = UNDECIDED;  /* soldonce's decision on each payment */
byte inflight[P];           /* facts about payment p on their way to soldonce */

#define CONF(i) (state[i] == CONFIRMED -> 1 : 0)
#define ATT(p)  (disp[p] == ATTACHED -> 1 : 0)
#define PAID(p) (psp[p] == AUTH || psp[p] == CAPT)   /* confirms: held or taken */
#define STANDING(p) (psp[p] == CAPT && !refunded[p])

/* What holds in every reachable state: checked after every step that moves
   stock or decides a payment. */
inline check() {
    assert(available + reserved + sold == UNITS);
    assert(sold == CONF(0) + CONF(1));
    assert(CONF(0) == ATT(0) + ATT(1));
    assert(CONF(1) == ATT(2) + ATT(3))
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
            if
            :: psp[2 * i] = AUTH
            :: psp[2 * i] = DECLINED
            :: psp[2 * i] = PROC
            :: psp[2 * i] = ACTION
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
        psp[2 * i + 1] = AUTH;
        printf("MSC: order %d paid a second time: payment %d\n", i, 2 * i + 1);
        tell(2 * i + 1)
    }
}

byte resent = 0;    /* webhooks sent again after their first attempt */

/* One step per payment: the guard comes first, so a process with nothing
   to do is blocked at the top of its loop (a valid end state). */
#define SETTLE(q) \
    :: atomic { psp[q] == PROC -> if :: psp[q] = AUTH :: psp[q] = DECLINED fi; \
        printf("MSC: payment %d settles: %e\n", q, psp[q]); tell(q) } \
    :: atomic { psp[q] == ACTION -> if :: psp[q] = AUTH :: psp[q] = VOIDED fi; \
        printf("MSC: the buyer acts on payment %d: %e\n", q, psp[q]); tell(q) } \
    :: atomic { (psp[q] == AUTH || psp[q] == DECLINED || psp[q] == VOIDED) && resent < 1 -> resent++; tell(q) }

proctype psp_settles() {
end:
    do
    SETTLE(0)
    SETTLE(1)
    SETTLE(2)
    SETTLE(3)
    od
}

#define LEARN(q) :: atomic { inflight[q] > 0 -> inflight[q]--; learn(q) }

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
    :: psp[q] == CAPT && !refunded[q] -> refunded[q] = true;
        printf("MSC: payment %d refunded at the PSP\n", q)
#ifdef REFUND_NOT_VOID
    :: psp[q] == AUTH -> printf("MSC: payment %d: a refund of an authorization, refused\n", q)
#else
    :: psp[q] == AUTH -> assert(disp[q] == REFUND); psp[q] = VOIDED;
        printf("MSC: payment %d voided at the PSP\n", q)
#endif
    :: else -> skip
    fi
}

#define REFUND_AT_PSP(q) :: atomic { disp[q] == REFUND && ((psp[q] == CAPT && !refunded[q]) || psp[q] == AUTH) -> compensate(q) }

proctype compensation() {
end:
    do
    REFUND_AT_PSP(0)
    REFUND_AT_PSP(1)
    REFUND_AT_PSP(2)
    REFUND_AT_PSP(3)
    od
}

/* Ships a confirmed order, deciding the capture of the payment it stands on. */
inline ship(i) {
    shipped[i] = true;
    if
    :: disp[2 * i] == ATTACHED -> capture_owed[2 * i] = true
    :: disp[2 * i + 1] == ATTACHED -> capture_owed[2 * i + 1] = true
    fi;
    printf("MSC: order %d ships; its capture is decided\n", i)
}

proctype warehouse(byte i) {
end:
    atomic { state[i] == CONFIRMED && !shipped[i] -> ship(i) }
}

/* Carries out a decided capture, once: only ever of the attached payment. */
inline capture(q) {
    assert(disp[q] == ATTACHED);
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
    byte i, p;
    atomic {
        for (i : 0 .. N - 1) {
            run buyer(i);
            run worker(i);
            run warehouse(i);
#ifndef NO_EXPIRY
            run cancel_or_expire(i)
#endif
        }
        run second_payment(0);
        run psp_settles();
        run learner();
        run compensation();
        run capturer();
        run reconcile_once()
    }
    timeout;
    /* Nothing can move any more. Expiry is enabled for every pending order
       and the PSP settles every processing payment, so none may be left:
       that is "every order ends". Then what runs forever in the real system
       runs once more: reconciliation re-learns every payment, compensation
       refunds what is owed. */
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
            :: state[i] == CONFIRMED && !shipped[i] -> ship(i)
            :: else -> skip
            fi
        }
        for (p : 0 .. P - 1) {
            if
            :: disp[p] == REFUND -> compensate(p)
            :: capture_owed[p] && psp[p] == AUTH -> capture(p)
            :: else -> skip
            fi
        }
        for (p : 0 .. P - 1) {
            /* every authorization ended: captured (its order shipped) or voided */
            assert(psp[p] != AUTH);
            assert(psp[p] != CAPT || disp[p] == ATTACHED || refunded[p]);
            assert(psp[p] != VOIDED || disp[p] != ATTACHED)
        }
        for (i : 0 .. N - 1) {
            if
            :: state[i] == CONFIRMED ->
                assert(STANDING(2 * i) + STANDING(2 * i + 1) == 1);
                assert((STANDING(2 * i) && disp[2 * i] == ATTACHED)
                    || (STANDING(2 * i + 1) && disp[2 * i + 1] == ATTACHED))
            :: else ->
                assert(!STANDING(2 * i) && !STANDING(2 * i + 1))
            fi
        }
    }
}
