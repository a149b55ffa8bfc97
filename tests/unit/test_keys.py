"""Lock-key derivation (celery_redlock.keys)."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import uuid
from decimal import Decimal

import pytest

from celery_redlock.exceptions import ConfigurationError, LockKeyError
from celery_redlock.keys import DIGEST_LENGTH, KeyBuilder, digest
from tests.support.signatures import charge, flexible, process, spread

KEY_RE = re.compile(rf"^charge:\{{[0-9a-f]{{{DIGEST_LENGTH}}}\}}$")


def kb(func=charge, lock_on=None, **kw):
    kw.setdefault("lock_name", "charge")
    return KeyBuilder(func, lock_on, **kw)


def test_format_and_length():
    key = kb().build((1,), {})
    assert KEY_RE.match(key), key
    assert DIGEST_LENGTH == 32


def test_positional_keyword_and_defaults_agree():
    b = kb()
    keys = {
        b.build((1,), {}),
        b.build((1, 10), {}),
        b.build((), {"account_id": 1}),
        b.build((), {"amount": 10, "account_id": 1}),
        b.build((1,), {"currency": "EUR"}),
    }
    assert len(keys) == 1


def test_different_values_differ():
    b = kb()
    assert b.build((1,), {}) != b.build((2,), {})
    assert b.build((1,), {}) != b.build((1, 11), {})
    assert b.build((1,), {}) != b.build((1,), {"currency": "USD"})
    assert b.build((1,), {}) != b.build(("1",), {})


def test_lock_name_is_part_of_the_key():
    assert kb(lock_name="a").build((1,), {}) != kb(lock_name="b").build((1,), {})


def test_fencing_token_is_excluded():
    b = kb()
    assert b.build((1,), {}) == b.build((1,), {"fencing_token": 12345})
    sel = kb(lock_on=["account_id"])
    assert sel.build((1,), {}) == sel.build((1,), {"fencing_token": 7})


def test_token_arg_is_configurable():
    def run(a, lease=None):
        pass

    b = kb(run, token_arg="lease")
    assert b.build((1,), {}) == b.build((1,), {"lease": 99})
    plain = kb(run, token_arg=None)
    assert plain.build((1,), {}) != plain.build((1,), {"lease": 99})


def test_selecting_the_token_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="fencing_token"):
        kb(lock_on=["fencing_token"])


def test_lock_on_subset_ignores_other_arguments():
    b = kb(lock_on=["account_id"])
    assert b.build((1, 10), {}) == b.build((1, 99), {"currency": "USD"})
    assert b.build((1,), {}) != b.build((2,), {})
    assert KEY_RE.match(b.build((1,), {}))


def test_bare_string_is_one_selector():
    assert kb(lock_on="account_id").build((1, 5), {}) == kb(lock_on=["account_id"]).build(
        (1, 6), {}
    )


def test_selector_key_is_a_mapping_so_order_does_not_matter():
    a = kb(lock_on=["account_id", "amount"])
    b = kb(lock_on=["amount", "account_id"])
    assert a.build((1, 2), {}) == b.build((1, 2), {})
    # {selector: value}, so two arguments swapped do not collide
    assert a.build((1, 2), {}) != a.build((2, 1), {})


def test_key_hashes_selector_mapping():
    b = kb(lock_on=["account_id"])
    assert b.build((5,), {}) == "charge:{" + digest({"account_id": 5}) + "}"


def test_empty_lock_on_means_one_lock_per_name():
    b = kb(lock_on=[])
    assert b.build((1,), {}) == b.build((2, 3), {"currency": "USD"})
    assert KEY_RE.match(b.build((1,), {}))


def test_dotted_path_nested_and_list_index():
    b = kb(process, ["order.customer.id", "items.0.sku"])
    order = {"customer": {"id": 7, "name": "Ann"}, "total": 3}
    key = b.build((order, [{"sku": "A", "qty": 1}]), {})
    other = {"customer": {"id": 7, "name": "Bob"}, "total": 9}
    assert key == b.build((other,), {"items": ({"sku": "A", "qty": 5}, {"sku": "Z"})})
    assert key != b.build((order, [{"sku": "B"}]), {})
    assert key != b.build(({"customer": {"id": 8}}, [{"sku": "A"}]), {})


def test_integer_step_into_int_keyed_mapping():
    # The pickle serializer keeps int keys; JSON turns them into strings.
    b = kb(process, ["order.3"])
    assert b.build(({3: "x"},), {}) == b.build(({"3": "x"},), {})


def test_missing_path_at_run_time():
    b = kb(process, ["order.customer.id"])
    with pytest.raises(LockKeyError, match=r"charge.*order\.customer\.id.*'id'") as info:
        b.build(({"customer": {}},), {})
    assert not isinstance(info.value, KeyError)
    with pytest.raises(LockKeyError, match="order.customer.id"):
        b.build(({},), {})
    with pytest.raises(LockKeyError, match="NoneType"):
        b.build(({"customer": None},), {})
    idx = kb(process, ["items.2"])
    with pytest.raises(LockKeyError, match="items.2"):
        idx.build(({}, [1, 2]), {})
    with pytest.raises(LockKeyError, match="items.x"):
        kb(process, ["items.x"]).build(({}, [1]), {})
    with pytest.raises(LockKeyError, match="str"):
        kb(process, ["note.0"]).build(({},), {"note": "abc"})


def test_bad_selector_at_construction():
    with pytest.raises(ConfigurationError) as info:
        kb(lock_on=["acount_id"], task_name="shop.charge")
    msg = str(info.value)
    assert "shop.charge" in msg and "acount_id" in msg
    assert "account_id" in msg and "amount" in msg and "currency" in msg
    assert "fencing_token" not in msg
    with pytest.raises(ConfigurationError, match="empty step"):
        kb(lock_on=["account_id..x"])
    with pytest.raises(ConfigurationError, match="lock_on"):
        kb(lock_on=[1])
    with pytest.raises(ConfigurationError, match="lock_on"):
        kb(lock_on=42)
    with pytest.raises(ConfigurationError, match="lock_on"):
        kb(lock_on={"account_id"})


@pytest.mark.parametrize("name", ["", "a{b", "a}b", None, 3])
def test_bad_lock_name(name):
    with pytest.raises(ConfigurationError, match="lock name"):
        KeyBuilder(charge, lock_name=name)


def test_configuration_error_is_improperly_configured():
    from celery.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured):
        kb(lock_on=["nope"])


def test_var_keyword_selectors():
    b = kb(flexible, ["tenant", "region", "scope.id"])
    key = b.build(("t1",), {"region": "eu", "scope": {"id": 1}, "verbose": True})
    assert key == b.build((), {"tenant": "t1", "scope": {"id": 1}, "region": "eu"})
    assert key != b.build(("t1",), {"region": "us", "scope": {"id": 1}})
    with pytest.raises(LockKeyError, match="region"):
        b.build(("t1",), {"scope": {"id": 1}})


def test_var_positional_and_keyword_included_by_default():
    b = kb(spread)
    assert b.build((1, 2, 3), {"x": 1}) != b.build((1, 2), {"x": 1})
    assert b.build((1, 2, 3), {"x": 1}) != b.build((1, 2, 3), {"x": 2})
    assert b.build((1,), {"x": 1, "y": 2}) == b.build((1,), {"y": 2, "x": 1})
    assert kb(spread, ["rest.1"]).build((0, "a", "b"), {}) == kb(spread, ["rest.1"]).build(
        (9, "z", "b"), {}
    )


def test_callable_lock_on():
    seen = []

    def pick(account_id, amount=0, **kwargs):
        seen.append(kwargs)
        return account_id % 2

    b = kb(lock_on=pick)
    assert b.build((1, 10), {}) == b.build((3,), {"amount": 99})
    assert b.build((1,), {}) != b.build((2,), {})
    b.build((5,), {"fencing_token": 1})
    assert seen[-1] == {}  # the token is not passed on
    assert b.build((1,), {}) == "charge:{" + digest({"": 1}) + "}"


def test_callable_string_result_is_hashed():
    b = kb(lock_on=lambda account_id, **_: f"acct-{account_id}")
    key = b.build((4242,), {})
    assert KEY_RE.match(key) and "4242" not in key


def test_callable_errors_become_lock_key_errors():
    def boom(*args, **kwargs):
        raise KeyError("x")

    with pytest.raises(LockKeyError, match="KeyError") as info:
        kb(lock_on=boom).build((1,), {})
    assert isinstance(info.value.__cause__, KeyError)
    with pytest.raises(LockKeyError, match="lock_on"):
        kb(lock_on=lambda *a, **k: object()).build((1,), {})


def test_types_make_different_keys():
    """The trap the keys page warns about: four spellings of one order, four keys."""
    b = kb(lock_on="account_id")
    assert len({b.build((v,), {}) for v in (7, 7.0, Decimal("7"), "7")}) == 4


def test_mapping_converts_before_hashing():
    b = kb(lock_on={"account_id": int})
    keys = {
        b.build(("7",), {}),
        b.build((7, 20), {}),
        b.build((), {"account_id": "7", "amount": 5}),
        b.build((7.0,), {"currency": "USD"}),
    }
    # One key, and it is the key of lock_on="account_id" with the int.
    assert keys == {kb(lock_on="account_id").build((7,), {})}
    assert b.build(("8",), {}) != b.build(("7",), {})


def test_mapping_takes_dotted_paths_and_several_parameters():
    b = kb(process, {"order.customer.id": int, "note": str.lower})
    assert b.build(({"customer": {"id": "7"}},), {"note": "VIP"}) == b.build(
        ({"customer": {"id": 7}}, ()), {"note": "vip"}
    )
    plain = kb(process, ["order.customer.id", "note"])
    assert b.build(({"customer": {"id": "7"}},), {"note": "X"}) == plain.build(
        ({"customer": {"id": 7}},), {"note": "x"}
    )


def test_bad_mapping_fails_at_bind_naming_the_parameter():
    with pytest.raises(ConfigurationError, match=r"'order_id' does not start with a parameter"):
        kb(lock_on={"order_id": int}, task_name="shop.charge")
    with pytest.raises(ConfigurationError, match=r"shop.charge.*maps 'account_id' to 'int'.*not"):
        kb(lock_on={"account_id": "int"}, task_name="shop.charge")
    with pytest.raises(ConfigurationError, match=r"maps 1, which is not a parameter name"):
        kb(lock_on={1: int})
    with pytest.raises(ConfigurationError, match="fencing-token"):
        kb(lock_on={"fencing_token": int})


def test_mapping_function_errors_name_the_selector():
    with pytest.raises(LockKeyError, match=r"lock_on\['account_id'\] raised ValueError on a str"):
        kb(lock_on={"account_id": int}).build(("seven",), {})


def test_callable_gets_the_arguments_by_name_however_they_were_passed():
    b = kb(lock_on=lambda account_id, **_: int(account_id))
    key = b.build(("7", 20), {"currency": "USD"})  # amount by position
    assert key == b.build((), {"amount": 1, "account_id": 7}) == b.build((7,), {})
    assert key == "charge:{" + digest({"": 7}) + "}"
    # Without **kwargs it gets only the parameters it names.
    assert kb(lock_on=lambda account_id: account_id).build((7, 20), {}) == key
    # A parameter it needs gets run's default when the call left it out; its own
    # default stays its own.
    needs = kb(lock_on=lambda account_id, amount, **_: [account_id, amount])
    assert needs.build((7,), {}) == needs.build((7, 10), {})
    own = kb(lock_on=lambda account_id, amount=0, **_: [account_id, amount])
    assert own.build((7,), {}) == needs.build((7, 0), {})


def test_callable_by_name_takes_var_keyword_entries_and_never_the_token():
    seen = []

    def pick(tenant, **options):
        seen.append(options)
        return tenant

    kb(flexible, pick).build(("t",), {"region": "eu"})
    assert seen[-1] == {"region": "eu"}
    kb(lock_on=lambda **k: seen.append(k)).build((7,), {"fencing_token": 3})
    assert seen[-1] == {"account_id": 7}


def test_other_callables_get_the_arguments_as_passed():
    """*args, or a parameter run does not have: called as f(*args, **kwargs), as before."""
    assert kb(lock_on=lambda x, **_: x).build((7,), {}) == kb(
        lock_on=lambda account_id, **_: 7
    ).build((1,), {})
    # run's *rest is no name to take: the callable is called as before.
    assert kb(spread, lambda first, rest: rest).build((0, "a"), {}) == kb(
        spread, lambda first, **_: "a"
    ).build((0,), {})
    seen = []
    kb(lock_on=lambda *a, **k: seen.append((a, k))).build((7, 20), {"currency": "USD"})
    assert seen == [((7, 20), {"currency": "USD"})]
    assert kb(lock_on=int).build(("7",), {}) == kb(lock_on=lambda account_id: 7).build((1,), {})


def test_build_selected_takes_the_lock_on_arguments_alone():
    whole = kb(lock_on=["currency", "account_id"])
    expected = whole.build((7, 20), {"currency": "USD"})
    assert whole.build_selected(("USD", 7), {}) == expected  # in lock_on order
    assert whole.build_selected(("USD",), {"account_id": 7}) == expected
    assert whole.build_selected((), {"account_id": 7, "currency": "USD"}) == expected
    for args, kwargs, match in [
        ((1, 2, 3), {}, r"3 values given, lock_on selects 2: currency, account_id"),
        (("USD",), {"currency": "EUR"}, "'currency' is given twice"),
        (("USD",), {"amount": 1}, "'amount' is not a lock_on selector"),
        (("USD",), {}, "no value for lock_on 'account_id'"),
    ]:
        with pytest.raises(LockKeyError, match=match):
            whole.build_selected(args, kwargs)
    mapped = kb(process, {"order.customer.id": int})
    assert mapped.build_selected(("7",), {}) == mapped.build(({"customer": {"id": 7}},), {})
    assert mapped.build_selected((), {"order.customer.id": 7}) == mapped.build_selected(("7",), {})
    picked = kb(lock_on=lambda account_id, **_: int(account_id))
    assert picked.build_selected(("7",), {}) == picked.build((7, 20), {})
    assert kb(lock_on=[]).build_selected((), {}) == kb(lock_on=[]).build((1,), {})
    assert kb().build_selected((7,), {}) == kb().build((7,), {})


def test_tuple_and_list_agree_as_after_json_round_trip():
    b = kb(process)
    order, items = {"ids": (1, (2, 3))}, ({"a": (1, 2)},)
    sent_order, sent_items = json.loads(json.dumps([order, items]))
    assert isinstance(sent_items, list) and isinstance(sent_order["ids"], list)
    assert b.build((order, items), {}) == b.build((sent_order, sent_items), {})
    assert b.build((order,), {"items": items}) == b.build((sent_order,), {"items": sent_items})


def test_int_keys_agree_with_their_json_form():
    b = kb(process)
    data = {1: "a", 2: "b", 10: "c"}  # 10 sorts after 2 as int, before it as str
    assert b.build((data,), {}) == b.build((json.loads(json.dumps(data)),), {})
    assert b.build(({1: "a", "b": 2},), {}) == b.build(({"1": "a", "b": 2},), {})


def test_int_and_float_differ():
    b = kb()
    assert b.build((1,), {}) != b.build((1.0,), {})


def test_sets_are_sorted():
    b = kb(process)
    assert b.build(({"x", "y", "z"},), {}) == b.build((frozenset(["z", "y", "x"]),), {})
    assert b.build(({1, 2, 10},), {}) != b.build(({1, 2},), {})


def test_kombu_types():
    b = kb(process)
    values = [
        datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.timezone.utc),
        datetime.date(2024, 5, 1),
        datetime.time(12, 30),
        Decimal("12.50"),
        uuid.UUID(int=7),
        b"\x00\xffraw",
    ]
    keys = [b.build((v,), {}) for v in values]
    assert all(KEY_RE.match(k) for k in keys)
    assert len(set(keys)) == len(keys)
    assert b.build((Decimal("1.0"),), {}) != b.build((Decimal("1.00"),), {})
    assert b.build((uuid.UUID(int=7),), {}) == b.build((uuid.UUID(int=7),), {})


def test_kombu_round_trip_keeps_the_key():
    from kombu.utils.json import dumps, loads

    b = kb(process)
    args = (
        {"when": datetime.datetime(2024, 1, 2, 3, 4, 5), "amount": Decimal("3.10")},
        (uuid.UUID(int=1), b"bytes"),
    )
    assert b.build(args, {}) == b.build(tuple(loads(dumps(list(args)))), {})


def test_unencodable_value_names_parameter_and_type():
    class Session:
        pass

    b = kb(process, task_name="shop.process")
    with pytest.raises(LockKeyError) as info:
        b.build(({"id": 1},), {"note": Session()})
    msg = str(info.value)
    assert "shop.process" in msg and "'note'" in msg and "Session" in msg
    assert isinstance(info.value, TypeError)
    with pytest.raises(LockKeyError, match=r"'order' \(dict\).*object"):
        b.build(({"id": object()},), {})
    with pytest.raises(LockKeyError, match="order.id"):
        kb(process, ["order.id"]).build(({"id": object()},), {})


def test_circular_value_is_a_lock_key_error():
    loop: list = []
    loop.append(loop)
    with pytest.raises(LockKeyError, match="'order'"):
        kb(process).build((loop,), {})


def test_arguments_that_do_not_bind():
    with pytest.raises(LockKeyError, match=r"shop\.charge.*account_id") as info:
        kb(task_name="shop.charge").build((), {})
    assert isinstance(info.value.__cause__, TypeError)
    with pytest.raises(LockKeyError, match="unexpected"):
        kb().build((1,), {"colour": "red"})


def test_bound_method():
    class Task:
        def run(self, account_id, amount=10):
            pass

    b = KeyBuilder(Task().run, lock_name="charge")
    assert b.build((1,), {}) == b.build((), {"account_id": 1, "amount": 10})
    assert b.build((1,), {}) == kb(lambda account_id, amount=10: None).build((1,), {})
    with pytest.raises(ConfigurationError, match="self"):
        KeyBuilder(Task().run, ["self"], lock_name="charge")


def test_raw_values_never_appear():
    secret = "alice@example.com"
    for lock_on in (None, ["order.email"], lambda order, **_: order["email"]):
        key = kb(process, lock_on).build(({"email": secret},), {})
        assert secret not in key and "alice" not in key
        assert KEY_RE.match(key)


def test_stable_across_processes_and_hash_seeds():
    code = (
        "from celery_redlock.keys import KeyBuilder\n"
        "def run(tags, data, n=1): pass\n"
        "b = KeyBuilder(run, lock_name='charge')\n"
        "print(b.build(({'x', 'y', 'z', 'w', 'v'},), "
        "{'data': {'b': 1, 'a': [1, 2], 'c': frozenset({'p', 'q', 'r'})}}))\n"
    )
    keys = set()
    for seed in ("1", "2", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        keys.add(out.stdout.strip())
    assert len(keys) == 1
    (key,) = keys
    assert KEY_RE.match(key)

    def run(tags, data, n=1):
        pass

    here = KeyBuilder(run, lock_name="charge").build(
        ({"v", "w", "x", "y", "z"},), {"data": {"a": [1, 2], "c": {"r", "q", "p"}, "b": 1}}
    )
    assert here == key


def test_known_digest_is_pinned():
    # sha256('{"a":1}')[:32]. Changing the canonical form would split locks
    # between old and new workers during a deploy.
    assert digest({"a": 1}) == "015abd7f5cc57a2dd94b7590f04ad808"


def test_digest_of_unencodable_value():
    with pytest.raises(LockKeyError, match="object"):
        digest(object())


def test_repr():
    assert "charge" in repr(kb(lock_on=["account_id"]))
