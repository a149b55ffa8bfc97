"""Task signatures the key tests bind arguments against."""


def charge(account_id, amount=10, *, currency="EUR", fencing_token=None):
    pass


def process(order, items=(), note=None):
    pass


def flexible(tenant, **options):
    pass


def spread(first, *rest, **extra):
    pass
