-- warden job_submit rules: only warden submits to, or modifies jobs in, the partitions it governs.
--
-- Install as job_submit.lua next to slurm.conf with JobSubmitPlugins=lua, and list warden's
-- partitions and the uids warden and Slurm run as (root and SlurmUser) below. warden's start
-- check refuses a partition that no such file (with the marker line above) names.
-- A submission, or a change to a job (hold, release, time limit, priority, partition), that
-- touches one of these partitions is refused unless it comes from one of the trusted uids; so a
-- job's own code cannot take GPUs behind warden's back or tamper with another attempt.

local GOVERNED = { "main" } -- warden-partitions
local TRUSTED_UIDS = { 0 } -- warden-trusted-uids: root and SlurmUser

local function listed(list, value)
	for _, v in ipairs(list) do
		if v == value then
			return true
		end
	end
	return false
end

local function governed(partitions)
	if partitions == nil then
		return false
	end
	for name in string.gmatch(partitions, "[^,]+") do
		if listed(GOVERNED, name) then
			return true
		end
	end
	return false
end

local function default_partition(part_list)
	for name, part in pairs(part_list) do
		if part.flag_default == 1 then
			return part.name or name
		end
	end
	return nil
end

local function trusted(uid)
	return listed(TRUSTED_UIDS, uid)
end

function slurm_job_submit(job_desc, part_list, submit_uid)
	if trusted(submit_uid) then
		return slurm.SUCCESS
	end
	local partitions = job_desc.partition
	if partitions == nil then
		partitions = default_partition(part_list)
	end
	if partitions == nil or governed(partitions) then
		slurm.log_user("partition %s is governed by warden: submit through warden", partitions or "(default)")
		return slurm.ESLURM_ACCESS_DENIED
	end
	return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	if trusted(modify_uid) then
		return slurm.SUCCESS
	end
	if governed(job_rec.partition) or governed(job_desc.partition) then
		slurm.log_user("jobs in partition %s are governed by warden: change them through warden", job_rec.partition)
		return slurm.ESLURM_ACCESS_DENIED
	end
	return slurm.SUCCESS
end

slurm.log_info("warden job_submit rules loaded for partitions %s", table.concat(GOVERNED, ","))

return slurm.SUCCESS
