/** The TypeScript bank against the Rust and Python banks' own tests, on the node test host. */

import assert from "node:assert/strict";
import { test } from "node:test";
import { HandlerError, encodeKey } from "wakuwaku-guest";
import { fromUtf8, utf8 } from "wakuwaku-guest/json";
import { MemoryHost } from "wakuwaku-guest/testing";
import bank, {
  ACCOUNT,
  Account,
  AccountClosed,
  AccountOpened,
  AccountStatusChanged,
  Deposited,
  OPEN_ACCOUNTS,
  Withdrawn,
  newAccount,
} from "../bank.js";

const ALICE = 42n;
const BOB = 7n;

const deposit = (account: bigint, amount: bigint, count = 1n) => Deposited.of({ account, amount, count });
const opened = (account: bigint, owner: string) => AccountOpened.of({ account, owner });

function account(host: MemoryHost, id: bigint): Account {
  const found = host.get(id, ACCOUNT, Account);
  assert.ok(found !== undefined, `account ${id} exists`);
  return found;
}

function unrecoverable(pattern: RegExp) {
  return (error: unknown) => {
    assert.ok(error instanceof HandlerError && error.errorClass === "unrecoverable", String(error));
    assert.match(error.message, pattern);
    return true;
  };
}

test("describes its five event types as the Rust bank does", () => {
  const info = bank.describe();
  assert.deepEqual(
    info.eventTypes.map((type) => [type.tag, type.name, type.algebra, type.maxBatch, type.timing]),
    [
      [1, "AccountOpened", "non-associative", 256, "untimed"],
      [2, "Deposited", "associative", 256, "untimed"],
      [3, "Withdrawn", "non-associative", 256, "untimed"],
      [4, "AccountClosed", "non-associative", 256, "untimed"],
      [5, "AccountStatusChanged", "non-associative", 256, "untimed"],
    ],
  );
  assert.deepEqual(info.emits, []);
});

test("folded deposits equal separate deposits", () => {
  const deposits = [100n, 250n, -30n, 5n].map((amount) => deposit(ALICE, amount));
  const separate = new MemoryHost(bank);
  separate.handle(deposits);
  const folded = new MemoryHost(bank);
  folded.handleReduced(deposits);
  const expected = { ...newAccount(), balance: 325n, deposits: 4n };
  assert.deepEqual(account(separate, ALICE), expected);
  assert.deepEqual(account(folded, ALICE), expected);
  // Folding folded deposits still counts every original deposit.
  const bodies = deposits.map((d) => Deposited.encode(d.value));
  const [left, right] = [bank.combine(2, bodies.slice(0, 2)), bank.combine(2, bodies.slice(2))];
  assert.deepEqual(bank.combine(2, [left, right]), bank.combine(2, bodies));
  assert.deepEqual(Deposited.decode(bank.combine(2, bodies)), { account: ALICE, amount: 325n, count: 4n });
});

test("bodies and state are the Rust bank's bytes", () => {
  assert.equal(fromUtf8(Deposited.encode(deposit(ALICE, 5n).value)), '{"account":42,"amount":5}');
  assert.equal(Deposited.decode(utf8('{"account":42,"amount":5}')).count, 1n);
  assert.equal(fromUtf8(Deposited.encode(deposit(ALICE, 5n, 3n).value)), '{"account":42,"amount":5,"count":3}');
  assert.equal(
    fromUtf8(AccountStatusChanged.encode({ account: 1n, status: "frozen" })),
    '{"account":1,"status":"frozen"}',
  );
  const host = new MemoryHost(bank);
  host.handle([opened(ALICE, "ann"), deposit(ALICE, 100n), Withdrawn.of({ account: ALICE, amount: 30n })]);
  assert.equal(
    fromUtf8(host.getBytes(ALICE, ACCOUNT)!),
    '{"owner":"ann","balance":70,"status":"active","opened":1,"deposits":1,"withdrawals":1,"closes":0,"status_changes":0}',
  );
});

test("orderings are chosen per message", () => {
  const ordering = (tag: number, body: string) => bank.ordering(tag, utf8(body));
  assert.equal(ordering(1, '{"account":1,"owner":"a"}'), "acquire");
  assert.equal(ordering(2, '{"account":1,"amount":3}'), "relaxed");
  assert.equal(ordering(3, '{"account":1,"amount":3}'), "relaxed");
  assert.equal(ordering(4, '{"account":1}'), "release");
  assert.equal(ordering(5, '{"account":1,"status":"active"}'), "relaxed");
  assert.equal(ordering(5, '{"account":1,"status":"frozen"}'), "acq-rel");
  assert.equal(ordering(5, '{"account":1,"status":"closed"}'), "release");
});

test("the key is the account as an integer key", () => {
  assert.deepEqual(bank.key(3, utf8('{"account":42,"amount":1}')), encodeKey(42));
  assert.deepEqual(encodeKey(42), new Uint8Array([0x01, 0x54]));
});

test("open, deposit, withdraw, close, reopen", () => {
  const host = new MemoryHost(bank);
  host.handle([opened(ALICE, "alice"), opened(BOB, "bob")]);
  host.handle([deposit(ALICE, 100n), deposit(ALICE, 50n), deposit(BOB, 9n)]);
  host.handle([Withdrawn.of({ account: ALICE, amount: 30n })]);
  assert.equal(host.counter(OPEN_ACCOUNTS), 2n);
  host.handle([AccountClosed.of({ account: ALICE })]);
  assert.equal(host.counter(OPEN_ACCOUNTS), 1n);
  const closed = account(host, ALICE);
  assert.deepEqual([closed.status, closed.balance], ["closed", 120n]);
  host.handle([opened(ALICE, "alice b.")]);
  host.handle([AccountStatusChanged.of({ account: ALICE, status: "frozen" })]);
  assert.deepEqual(account(host, ALICE), {
    owner: "alice b.",
    balance: 120n,
    status: "frozen",
    opened: 2n,
    deposits: 2n,
    withdrawals: 1n,
    closes: 1n,
    status_changes: 1n,
  });
  assert.deepEqual(account(host, BOB), { ...newAccount(), owner: "bob", balance: 9n, deposits: 1n, opened: 1n });
  assert.equal(host.counter(OPEN_ACCOUNTS), 2n);
});

test("events before opening apply to a default account", () => {
  const host = new MemoryHost(bank);
  host.handle([Withdrawn.of({ account: BOB, amount: 4n })]);
  assert.deepEqual(account(host, BOB), { ...newAccount(), balance: -4n, withdrawals: 1n });
});

test("amounts wrap as i64 arithmetic does", () => {
  const host = new MemoryHost(bank);
  host.handleReduced([deposit(ALICE, (1n << 63n) - 1n), deposit(ALICE, 1n)]);
  assert.equal(account(host, ALICE).balance, -(1n << 63n));
});

test("an unknown tag is unrecoverable and named", () => {
  assert.throws(() => new MemoryHost(bank).handleBodies(99, encodeKey(1), [utf8("{}")]), unrecoverable(/99/));
  assert.throws(() => bank.key(99, utf8("{}")), unrecoverable(/tag 99/));
  assert.throws(() => bank.ordering(0, utf8("{}")), unrecoverable(/tag 0/));
});

test("a malformed body is unrecoverable, names the type and leaves nothing", () => {
  const host = new MemoryHost(bank);
  host.handle([deposit(ALICE, 1n)]);
  assert.throws(
    () => host.handleBodies(2, encodeKey(ALICE), [Deposited.encode(deposit(ALICE, 1n).value), utf8('{"account":42}')]),
    unrecoverable(/^malformed Deposited body: missing field `amount`$/),
  );
  assert.equal(account(host, ALICE).deposits, 1n);
  assert.throws(() => bank.key(1, utf8("not json")), unrecoverable(/^malformed AccountOpened body: /));
  assert.throws(() => bank.ordering(5, utf8('{"account":1,"status":"asleep"}')), unrecoverable(/AccountStatusChanged/));
});

test("combine of a non-associative type is unrecoverable", () => {
  assert.throws(() => bank.combine(3, [utf8('{"account":1,"amount":3}')]), unrecoverable(/^Withdrawn is not associative$/));
});
