#!/usr/bin/env bash
# t_94_notify_flood.sh with the queue in lock mode lease: the same replay of 250,000
# NOTIFYs and the same bounds, with the claims made by the lease session (lease.c keeps
# a queue's quiet time after a claim made for a NOTIFY found nothing).
FLOOD_LOCK_MODE=lease exec bash "$(dirname "$0")/t_94_notify_flood.sh"
