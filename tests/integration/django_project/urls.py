from django.urls import path

from celery_redlock.django import dashboard_urls

urlpatterns = [
    path("locks/", dashboard_urls(actions=True)),
]
