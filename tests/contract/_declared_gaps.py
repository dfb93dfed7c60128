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
        "test_a_slot_freed_before_the_worker_waits_makes_its_parked_job_due",
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

PAYLOAD_SEARCH = frozenset(
    {
        "test_payload_contains_matches_a_substring_of_the_payloads_json",
        "test_payload_at_matches_a_value_at_a_json_path_by_type",
        "test_a_bad_payload_search_is_refused",
    }
)
"""The payload search tests (feature ``payload_search``): a store that would read
every payload to filter them does not offer it."""

KEYED = frozenset(
    {
        "test_debounce_extends_until_the_max_wait_caps_it",
        "test_a_debounce_call_while_the_job_runs_creates_the_next_run",
        "test_a_debounce_call_racing_the_claim_either_extends_or_makes_the_next_run",
        "test_throttle_runs_the_first_call_and_drops_the_rest_of_the_window",
        "test_trailing_throttle_folds_the_window_into_one_run_at_its_end",
        "test_unique_until_finished_keeps_through_retries_and_frees_on_finish",
        "test_unique_until_started_and_for_a_period",
        "test_append_collects_payloads_into_one_list_capped_at_max_items",
        "test_two_producers_appending_at_once_lose_no_item",
        "test_every_store_decides_keyed_calls_as_the_reference_does",
        "test_a_keys_next_call_after_its_run_was_purged_starts_again_at_run_1",
        "test_a_released_key_never_overwrites_an_earlier_runs_dead_letter",
        "test_a_throttle_window_outlives_its_runs_purge",
        "test_an_append_call_on_a_key_whose_open_run_is_not_a_batch_starts_its_own",
        "test_a_keyed_call_into_an_empty_due_set_wakes_a_waiting_worker",
        "test_a_new_run_skips_an_id_a_plain_job_already_holds",
    }
)
"""The keyed-call tests (feature ``keyed``): skipped by a store without it."""

RESULTS = frozenset(
    {
        "test_an_ack_s_result_is_kept_with_the_finished_record",
        "test_a_result_reads_back_exactly_with_any_text_and_at_64_kib",
        "test_a_retry_keeps_no_result_and_the_later_success_stores_its_own",
        "test_replace_of_a_finished_job_drops_its_result",
        "test_complete_and_claim_keeps_the_result_of_its_acks",
        "test_a_result_goes_with_its_record_after_result_ttl",
        "test_a_result_is_only_for_a_succeeded_ack",
    }
)
"""The result tests (feature ``results``): skipped by a store that keeps no finished records."""

HANDLER_FILTER = frozenset(
    {
        "test_a_filtered_claim_returns_only_those_names_in_due_order",
        "test_a_filtered_claim_takes_its_limit_from_the_head_of_its_names",
        "test_a_filtered_claim_leaves_other_names_due_jobs_untouched",
        "test_a_filtered_claim_of_a_name_without_jobs_claims_nothing",
        "test_a_filtered_claim_is_never_early",
        "test_a_filtered_claim_returns_expired_leases_of_every_name",
        "test_complete_and_claim_with_names_claims_only_those_names",
        "test_cancel_reschedule_and_retry_of_filtered_jobs_work_as_before",
        "test_an_empty_or_bad_handler_filter_is_refused",
        "test_a_filtered_wait_sleeps_past_other_names_due_jobs_until_its_own_head",
        "test_a_filtered_wait_with_nothing_of_its_names_sleeps_for_max_wait",
        "test_a_filtered_wait_wakes_when_a_job_of_its_names_arrives_before_its_head",
        "test_a_filtered_wait_returns_at_once_when_a_job_of_its_names_is_due",
        "test_a_filtered_waiter_on_another_handle_is_woken_by_a_new_head_of_its_names",
        "test_a_filtered_claim_keeps_the_flow_limits",
    }
)
"""The handler-filter tests (feature ``handler_filter``): skipped by a store whose claim
cannot take only some handlers' jobs."""

SKIPPED: dict[str, frozenset[str]] = {
    "memory": frozenset(
        {
            # one process's memory: no second handle, nothing survives close()
            "test_two_handles_never_hold_one_job_under_two_live_leases",
            "test_a_reopened_store_keeps_its_jobs",
            "test_an_edit_through_one_handle_is_seen_by_another",
            "test_records_survive_reopening_the_store",
            "test_two_handles_share_the_limits",
            "test_a_filtered_waiter_on_another_handle_is_woken_by_a_new_head_of_its_names",
        }
    ),
    "sqlite": frozenset(),
    # one due set for every handler (no per-handler index to claim or wait on yet)
    "redis": PAYLOAD_SEARCH | HANDLER_FILTER,
    "postgres": HANDLER_FILTER
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
            # a broker: no injected clock, no index of jobs (inspect: list, stats,
            # next_due); no schedule records
            "test_a_chain_makes_one_job_per_occurrence_however_often_ticks_run",
            "test_a_concurrent_reader_sees_a_batch_all_applied_or_not_at_all",
            "test_a_live_lease_is_still_running",
            "test_a_new_record_starts_at_version_1_and_reads_back",
            "test_a_retry_in_a_batch_wakes_a_waiter_when_it_becomes_the_earliest_job",
            "test_a_write_at_a_stale_version_changes_nothing",
            "test_an_edit_through_one_handle_is_seen_by_another",
            "test_bad_arguments_are_refused",
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
            "test_stats_count_due_jobs_on_the_backend_clock",
            "test_wait_for_due_returns_after_max_wait",
            "test_wait_for_due_returns_on_interrupt",
            "test_wait_for_due_returns_when_a_job_becomes_earlier",
            "test_wait_for_due_returns_when_an_earlier_job_is_enqueued_from_another_thread",
            "test_wait_for_due_sleeps_until_the_next_due_time",
            "test_wait_for_due_wakes_when_a_lease_expires",
            "test_a_cursor_combines_with_the_state_name_and_window_filters",
            "test_a_cursor_whose_job_is_gone_repeats_rather_than_skips",
            "test_a_malformed_cursor_is_refused",
            "test_list_jobs_filters_by_handler_name",
            "test_pages_follow_each_other_without_gaps_or_repeats_also_on_ties",
            "test_a_payload_longer_than_the_preview_is_listed_cut_and_get_has_it_whole",
            "test_a_preview_applies_to_a_named_and_paged_listing_too",
            "test_dead_letters_list_big_payloads_cut_too",
        }
    )
    | PAYLOAD_SEARCH  # a broker keeps no index of jobs to search
    | KEYED  # a broker keeps no record per key to decide a call against
    | RESULTS  # no finished records to keep a result with
    | FLOW_CONTROL  # a broker hands messages out in its own order; no claim step to limit
    | HANDLER_FILTER,  # every delivery of the ready queue goes to any consumer
}
"""store name -> names of the contract tests skipped for it (missing features)."""


SKIPPED_AT_RUN_TIME: dict[str, frozenset[str]] = {
    "rabbitmq": frozenset(
        {
            # inspect: the log answers get by id and decides on_conflict, not list_jobs,
            # stats or next_due (the test lists or counts)
            "test_a_released_job_is_due_again_at_once",
            "test_ack_after_the_lease_ran_out_is_accepted_while_nobody_else_claimed",
            "test_ack_marks_the_job_succeeded_with_its_outcome",
            "test_backend_matches_the_model",
            "test_complete_acks_every_claim_of_a_batch",
            "test_complete_with_only_stale_claims_changes_nothing",
            "test_enqueue_of_an_empty_batch_stores_nothing",
            "test_enqueue_rejects_a_bad_spec_and_stores_nothing_of_the_batch",
            "test_enqueue_returns_one_created_outcome_per_job",
            "test_list_jobs_filters_by_a_half_open_due_window",
            "test_list_jobs_filters_by_state_in_run_at_order",
            "test_list_jobs_respects_limit",
            "test_next_due_is_the_earliest_scheduled_job",
            "test_stats_of_an_empty_store_are_zero",
            "test_cancel_of_a_scheduled_job_cancels_it",
            "test_reschedule_moves_a_scheduled_job_earlier",
            "test_stats_count_every_state",
            "test_cancel_of_a_job_whose_lease_expired_takes_effect_and_says_an_attempt_started",
            # clock: the test moves its clock further ahead than real-time mode waits
            "test_reschedule_moves_a_scheduled_job_later",
            "test_reschedule_of_a_job_whose_lease_expired_moves_it_and_says_an_attempt_started",
            "test_ack_as_skipped_records_the_misfire_note",
            "test_bury_moves_the_job_to_the_dead_letters_with_its_error",
        }
    ),
}
"""store name -> the contract tests its real-time wrapper (``_realtime.py``) skips while they
run: a call the store refuses with ``Unsupported``, a duplicate id it cannot see, a clock
step too long to wait out. ``tests/contract/conftest.py`` fails a run-time skip that is not
listed here, and a listed test that runs."""


def run_time_gap_error(
    store: str, test: str, *, skipped_at_run_time: bool, ran: bool
) -> str | None:
    """Why one contract test's outcome on ``store`` breaks the table, or None if it keeps it.

    ``skipped_at_run_time``: the real-time wrapper skipped the test while it ran; ``ran``:
    the test body ran to the end (passed).
    """
    declared = test in SKIPPED_AT_RUN_TIME.get(store, frozenset())
    if skipped_at_run_time and not declared:
        return (
            f"{store} skipped {test} while it ran, and SKIPPED_AT_RUN_TIME does not say so: "
            "make the store keep the promise, or add the test to tests/contract/_declared_gaps.py"
        )
    if ran and declared:
        return (
            f"{test} now runs on {store}: remove it from SKIPPED_AT_RUN_TIME in "
            "tests/contract/_declared_gaps.py"
        )
    return None
