from django.db import models


class Order(models.Model):
    balance = models.IntegerField(default=0)
    #: The largest fencing token that wrote this row.
    fence = models.BigIntegerField(default=0)
    note = models.CharField(max_length=100, default="")


class Report(models.Model):
    builds = models.IntegerField(default=0)
