"""What each store does not promise, and the contract tests it therefore skips.

A store declares its promises in its class attribute ``features`` (names from
``delayq.backends.base.FEATURES``); every contract test that needs a feature a
store lacks is skipped for it. This table writes those skips down, and
``test_contract_features.py`` checks it against what the suite would skip: a
store that stops declaring a feature (or a test that starts needing one) fails
that check until the table says so, so no store drops tests silently.
"""

from __future__ import annotations

FLOW_CONTROL = frozenset(
    {
        "test_flow_control_keeps_its_rules",
        "test_a_freed_slot_wakes_a_worker_waiting_for_it",
        "test_limit_records_are_written_with_compare_and_set",
        "test_a_job_keeps_its_key_priority_and_group",
        "test_a_key_at_its_concurrency_limit_is_passed_over_and_claimed_when_a_slot_frees",
        "test_a_key_s_own_limit_wins_over_its_pattern",
        "test_an_expired_lease_frees_its_slot",
        "test_a_limit_edited_at_runtime_takes_effect_at_the_next_claim",
        "test_a_job_over_its_rate_is_throttled_until_its_next_allowed_time",
        "test_a_burst_lets_that_many_more_start_at_once",
        "test_a_throttled_job_can_be_cancelled_or_rescheduled",
        "test_higher_priority_first_then_due_order",
        "test_groups_take_turns",
        "test_a_big_group_gets_its_share_in_one_claim",
        "test_concurrent_claims_never_exceed_the_limit",
        "test_two_handles_share_the_limits",
    }
)
"""The flow-control tests (feature ``flow_control``): skipped by a store without it."""

SKIPPED: dict[str, frozenset[str]] = {
    "memory": frozenset(
        {
            # one process's memory: no second handle, nothing survives close()
            "test_two_handles_never_hold_one_job_under_two_live_leases",
            "test_a_reopened_store_keeps_its_jobs",
            "test_an_edit_through_one_handle_is_seen_by_another",
            "test_records_survive_reopening_the_store",
            "test_two_handles_share_the_limits",
        }
    ),
    "sqlite": frozenset(),
    "redis": frozenset(),
    # flow control is not in this store yet
    "postgres": FLOW_CONTROL
    | frozenset(
        {
            # attempts counted at claim, not from a recorded start (no attempt_at_start yet)
            "test_a_job_whose_leases_keep_expiring_unstarted_is_buried_after_max_unstarted",
            "test_an_expired_lease_after_a_recorded_start_counts_the_attempt",
            "test_an_expired_lease_without_a_recorded_start_gives_the_attempt_back",
            "test_cancel_of_a_job_whose_unstarted_lease_expired_says_no_attempt_started",
            "test_max_attempts_1_job_whose_claim_expired_unstarted_still_runs",
            "test_release_with_run_at_and_note_is_due_then_and_keeps_the_attempt",
        }
    ),
    "rabbitmq": frozenset(
        {
            # a broker: no injected clock, no index of jobs (inspect), no definite
            # cancel; no schedule records
            "test_a_chain_makes_one_job_per_occurrence_however_often_ticks_run",
            "test_a_concurrent_reader_sees_a_batch_all_applied_or_not_at_all",
            "test_a_live_lease_is_still_running",
            "test_a_new_record_starts_at_version_1_and_reads_back",
            "test_a_retry_in_a_batch_wakes_a_waiter_when_it_becomes_the_earliest_job",
            "test_a_write_at_a_stale_version_changes_nothing",
            "test_an_edit_through_one_handle_is_seen_by_another",
            "test_an_expired_lease_on_the_last_attempt_is_dead_so_cancel_says_finished",
            "test_bad_arguments_are_refused",
            "test_cancel_of_a_job_waiting_for_its_retry_says_an_attempt_started",
            "test_cancel_of_a_job_whose_lease_expired_takes_effect_and_says_an_attempt_started",
            "test_dead_letters_come_most_recently_buried_first",
            "test_dead_letters_outlive_result_ttl",
            "test_delete_removes_the_record_once_and_honours_a_version",
            "test_extend_keeps_the_lease_alive",
            "test_extend_many_renews_each_claim_and_reports_stale_ones",
            "test_an_error_with_a_nul_is_stored_with_the_nul_escaped_on_every_store",
            # attempts counted at claim, not from a recorded start (no attempt_at_start yet)
            "test_a_job_whose_leases_keep_expiring_unstarted_is_buried_after_max_unstarted",
            "test_an_expired_lease_after_a_recorded_start_counts_the_attempt",
            "test_an_expired_lease_without_a_recorded_start_gives_the_attempt_back",
            "test_cancel_of_a_job_whose_unstarted_lease_expired_says_no_attempt_started",
            "test_max_attempts_1_job_whose_claim_expired_unstarted_still_runs",
            "test_release_with_run_at_and_note_is_due_then_and_keeps_the_attempt",
            "test_finished_records_are_kept_for_result_ttl_then_purged",
            "test_purge_dead_older_than_keeps_recent_dead_letters",
            "test_records_list_by_name_and_keep_any_text",
            "test_records_survive_reopening_the_store",
            "test_release_keeps_the_error_of_an_earlier_attempt",
            "test_reschedule_of_a_job_whose_lease_expired_moves_it_and_says_an_attempt_started",
            "test_stats_count_due_jobs_on_the_backend_clock",
            "test_wait_for_due_returns_after_max_wait",
            "test_wait_for_due_returns_on_interrupt",
            "test_wait_for_due_returns_when_a_job_becomes_earlier",
            "test_wait_for_due_returns_when_an_earlier_job_is_enqueued_from_another_thread",
            "test_wait_for_due_sleeps_until_the_next_due_time",
            "test_wait_for_due_wakes_when_a_lease_expires",
            "test_a_job_cancelled_before_it_is_due_never_comes",
            "test_a_cursor_combines_with_the_state_name_and_window_filters",
            "test_a_cursor_whose_job_is_gone_repeats_rather_than_skips",
            "test_a_malformed_cursor_is_refused",
            "test_list_jobs_filters_by_handler_name",
            "test_pages_follow_each_other_without_gaps_or_repeats_also_on_ties",
        }
    )
    | FLOW_CONTROL,  # a broker hands messages out in its own order; no claim step to limit
}
"""store name -> names of the contract tests skipped for it (missing features)."""
