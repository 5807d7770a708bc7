//! The test from `spec/ordering.md` (the user's ordering page), copied verbatim:
//! the worked bank-account example must plan exactly as the page says.

#[cfg(test)]
mod tests {
    use wakuwaku::iggy::EventAtomicOrdering::{Acquire, Relaxed, Release};
    use wakuwaku::iggy::EventTypeTag;
    use wakuwaku::iggy::partition::plan::{Plan, PlanRecord};

    const OPENED: EventTypeTag = EventTypeTag::new(1);
    const DEPOSITED: EventTypeTag = EventTypeTag::new(2);
    const WITHDRAWN: EventTypeTag = EventTypeTag::new(3);
    const CLOSED: EventTypeTag = EventTypeTag::new(4);

    #[test]
    fn closing_waits_for_every_earlier_event() {
        let record = |key, tag, ordering| PlanRecord { key, tag, ordering };
        let batch = [
            record(42, OPENED, Acquire),    // 0
            record(42, DEPOSITED, Relaxed), // 1
            record(7, DEPOSITED, Relaxed),  // 2  another account
            record(42, WITHDRAWN, Relaxed), // 3
            record(42, DEPOSITED, Relaxed), // 4
            record(42, CLOSED, Release),    // 5
            record(42, OPENED, Acquire),    // 6  re-opened
            record(42, DEPOSITED, Relaxed), // 7
        ];
        let plan = Plan::new(&batch);

        let [account_42, account_7] = plan.keys() else { panic!() };
        assert_eq!(plan.segments(account_7).len(), 1);

        let [first, second] = plan.segments(account_42) else { panic!() };
        assert_eq!(plan.head(first).map(|run| plan.records(run)), Some(&[0][..]));
        let body: Vec<_> = plan.body(first).iter().map(|run| plan.records(run)).collect();
        assert_eq!(body, [&[1, 4][..], &[3][..]]); // deposits ∥ withdrawals
        assert_eq!(plan.tail(first).map(|run| plan.records(run)), Some(&[5][..]));
        assert_eq!(plan.head(second).map(|run| plan.records(run)), Some(&[6][..]));
        assert_eq!(plan.body(second).len(), 1);
    }
}
